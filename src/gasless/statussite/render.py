"""The status page (HTML with inline SVG: no script, readable without the API) and the incidents' Atom feed,
rendered from the feed files only."""

from __future__ import annotations

import datetime as dt
import uuid
from html import escape
from typing import Any
from xml.etree import ElementTree as ET

STALE_MS = 180_000  # three publication periods without a new feed: say so loudly
COLORS = {"operational": "#1a7f37", "degraded": "#bf8700", "outage": "#cf222e"}
LABELS = {"operational": "Operational", "degraded": "Degraded", "outage": "Outage"}


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _age(ms: int) -> str:
    seconds = max(0, ms // 1000)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _count(number: int, noun: str) -> str:
    """`1 sample`, `3 samples`, `0 samples`."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


FLOAT_HELP = (
    "Relayer float: whether the shard's relayers hold enough EGLD to pay the network fees of the "
    "transactions they relay. ok: funded; low: an active relayer holds less than five times the funding "
    "minimum; critical: no active relayer is funded. A label, never a balance."
)


def _availability_bars(days: list[dict[str, Any]]) -> str:
    width, gap, height = 6, 2, 34
    bars = []
    for index, day in enumerate(days):
        pct = day.get("availabilityPct")
        color = (
            "#d0d7de" if pct is None else "#1a7f37" if pct >= 99.9 else "#bf8700" if pct >= 99 else "#cf222e"
        )
        label = f"{_when(day['dayStartMs'])[:10]}: " + ("no data" if pct is None else f"{pct}%")
        if day.get("incidents"):
            label += f", {_count(int(day['incidents']), 'incident')}"
        bars.append(
            f'<rect class="day" x="{index * (width + gap)}" y="0" width="{width}" height="{height}" '
            f'fill="{color}" data-pct="{"" if pct is None else pct}"><title>{escape(label)}</title></rect>'
        )
    total = len(days) * (width + gap)
    return f'<svg class="availability" width="{total}" height="{height}" role="img" aria-label="90-day availability">{"".join(bars)}</svg>'


def _latency_chart(entry: dict[str, Any], title: str) -> str:
    figures = [
        ("added p50", entry.get("addedP50Ms")),
        ("added p99", entry.get("addedP99Ms")),
        ("inclusion p50", entry.get("inclusionP50Ms")),
        ("inclusion p95", entry.get("inclusionP95Ms")),
        ("inclusion p99", entry.get("inclusionP99Ms")),
    ]
    peak = max([v for _, v in figures if v] or [1])
    rows = []
    for index, (name, value) in enumerate(figures):
        y = index * 18
        width = 0 if value is None else max(1, int(220 * value / peak))
        text = "no data" if value is None else f"{value} ms"
        rows.append(
            f'<text x="0" y="{y + 12}" font-size="11">{name}</text>'
            f'<rect x="90" y="{y + 2}" width="{width}" height="12" fill="#0969da"></rect>'
            f'<text x="{95 + width}" y="{y + 12}" font-size="11">{text}</text>'
        )
    return (
        f'<figure class="latency" data-shard="{entry["shard"]}"><figcaption>{escape(title)} '
        f"({_count(int(entry.get('samples') or 0), 'sample')})</figcaption>"
        f'<svg width="380" height="{len(figures) * 18}" role="img" aria-label="{escape(title)}">{"".join(rows)}</svg></figure>'
    )


def page(status: dict[str, Any] | None, incidents: dict[str, Any] | None, now_ms: int, site_name: str) -> str:
    if status is None:
        body = '<p class="stale">No status has been published yet.</p>'
        return _document(site_name, body)
    age = now_ms - int(status.get("generatedAtMs", 0))
    stale = age > STALE_MS
    overall = status.get("overall", "outage")
    parts = [
        f'<section class="overall {escape(overall)}" style="background:{COLORS.get(overall, "#57606a")}">'
        f"<h2>{escape(LABELS.get(overall, overall))}</h2></section>",
        f'<p class="age{" stale" if stale else ""}">Published {_age(age)} ago ({_when(status.get("generatedAtMs"))})'
        + (" - the API has not published since: these may be out of date." if stale else "")
        + "</p>",
        '<h2>Components</h2><table class="components">'
        f'<caption class="float-help">{escape(FLOAT_HELP)}</caption>'
        "<tr><th>Component</th><th>Status</th>"
        f'<th class="float" title="{escape(FLOAT_HELP)}">Relayer float</th><th>Reason</th></tr>',
    ]
    floats = status.get("floatPerShard", {})
    for component in status.get("components", []):
        shard = component.get("shard")
        label = floats.get(str(shard), "") if shard is not None else ""
        parts.append(
            f'<tr class="component" data-id="{escape(component["id"])}" data-status="{escape(component["status"])}">'
            f"<td>{escape(component['name'])}</td>"
            f'<td style="color:{COLORS.get(component["status"], "#57606a")}">{escape(LABELS.get(component["status"], component["status"]))}</td>'
            f"<td>{escape(label)}</td><td>{escape(component.get('reason') or '')}</td></tr>"
        )
    parts.append("</table>")
    open_ = status.get("openIncidents", [])
    parts.append(f"<h2>Open incidents ({len(open_)})</h2>")
    for incident in open_:
        parts.append(_incident(incident))
    if not open_:
        parts.append('<p class="no-incidents">No open incident.</p>')
    parts.append("<h2>Availability, last 90 days</h2>")
    parts.append(_availability_bars(status.get("availabilityDaily90", [])))
    overall30 = status.get("availability30d")
    parts.append(
        f"<p>Last 30 days: {'not yet measured (fewer than 30 days of data)' if overall30 is None else f'{overall30}%'}"
        "; measured values only, no promise.</p>"
    )
    parts.append("<h2>Latency per shard</h2>")
    for entry in status.get("latency", []):
        parts.append(_latency_chart(entry, f"Shard {entry['shard']}, last hour"))
    for entry in status.get("latency30d", []):
        parts.append(_latency_chart(entry, f"Shard {entry['shard']}, 30 days"))
    recent = [i for i in (incidents or {}).get("items", []) if i.get("resolvedAtMs")]
    if recent:
        parts.append("<h2>Past incidents</h2>")
        parts.extend(_incident(i) for i in recent[:10])
    parts.append(
        '<p class="feeds">Feeds: <a href="/feed/incidents.atom" type="application/atom+xml">incidents (Atom)</a>'
        ' - <a href="/feed/status.json" type="application/json">status.json</a>'
        ' - <a href="/feed/incidents.json" type="application/json">incidents.json</a>'
        ' - <a href="/feed/telemetry.json" type="application/json">telemetry.json</a></p>'
    )
    return _document(site_name, "".join(parts))


def _incident(incident: dict[str, Any]) -> str:
    updates = "".join(
        f"<li><strong>{escape(u['status'])}</strong> {_when(u['atMs'])}: {escape(u['body'])}</li>"
        for u in incident.get("updates", [])
    )
    shard = f" (shard {incident['shard']})" if incident.get("shard") is not None else ""
    return (
        f'<article class="incident" id="{escape(incident["id"])}" data-id="{escape(incident["id"])}"><h3>{escape(incident["title"])}{shard}</h3>'
        f"<p>{escape(incident['status'])}, {escape(incident['impact'])} impact, since {_when(incident['createdAtMs'])}</p>"
        f"<ol>{updates}</ol></article>"
    )


def _document(site_name: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(site_name)} status</title>"
        f'<link rel="alternate" type="application/atom+xml" href="/feed/incidents.atom" '
        f'title="{escape(site_name)} incidents">'
        "<style>caption{caption-side:bottom;text-align:left;font-size:.85em;color:#57606a;padding-top:.4em}"
        "th.float{text-decoration:underline dotted;cursor:help}</style>"
        "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#1f2328}"
        ".overall{color:#fff;padding:.2em 1em;border-radius:6px}.stale{color:#cf222e;font-weight:bold}"
        "table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #d0d7de;text-align:left}"
        "figure{display:inline-block;margin:.5em 1em .5em 0}</style></head>"
        f"<body><h1>{escape(site_name)} status</h1>{body}</body></html>"
    )


ATOM = "http://www.w3.org/2005/Atom"
# Ids stay the same whatever address the site is reached at (RFC 4287 4.2.6: an id never changes).
_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:gasless:status-site")


def _urn(*parts: str) -> str:
    return uuid.uuid5(_ID_NAMESPACE, "/".join(parts)).urn


def atom(incidents: dict[str, Any] | None, site_url: str, site_name: str, generated_ms: int) -> bytes:
    """The incidents as an Atom 1.0 feed (RFC 4287): a feed with title, id, updated, author and a self link;
    each entry with id, title, updated, published, summary and an alternate link to the incident on the page.
    Ids are `urn:uuid:` URIs (stable, never a URL that would have to answer); `updated` is the newest
    incident's last change, or when the incidents were published (`generated_ms`) if there is none."""
    ET.register_namespace("", ATOM)

    def sub(parent: ET.Element, name: str, text: str | None = None, **attributes: str) -> ET.Element:
        element = ET.SubElement(parent, f"{{{ATOM}}}{name}", attributes)
        if text is not None:
            element.text = text
        return element

    feed = ET.Element(f"{{{ATOM}}}feed")
    sub(feed, "title", f"{site_name} incidents")
    sub(feed, "subtitle", f"Public incidents of {site_name}: each update as it is posted")
    sub(feed, "id", _urn(site_name, "incidents"))
    items = (incidents or {}).get("items", [])
    updated = max([int(i["updatedAtMs"]) for i in items] or [generated_ms])
    sub(feed, "updated", _iso(updated))
    author = sub(feed, "author")
    sub(author, "name", f"{site_name} operators")
    sub(author, "uri", f"{site_url}/")
    sub(feed, "link", rel="self", type="application/atom+xml", href=f"{site_url}/feed/incidents.atom")
    sub(feed, "link", rel="alternate", type="text/html", href=f"{site_url}/")
    sub(feed, "generator", "gasless status site")
    for incident in items:
        entry = sub(feed, "entry")
        sub(entry, "id", _urn(site_name, "incident", str(incident["id"])))
        shard = f" (shard {incident['shard']})" if incident.get("shard") is not None else ""
        sub(entry, "title", f"[{incident['status']}] {incident['title']}{shard}")
        sub(entry, "updated", _iso(int(incident["updatedAtMs"])))
        if incident.get("createdAtMs") is not None:
            sub(entry, "published", _iso(int(incident["createdAtMs"])))
        sub(entry, "link", rel="alternate", type="text/html", href=f"{site_url}/#{incident['id']}")
        latest = (incident.get("updates") or [{}])[-1]
        sub(
            entry,
            "summary",
            latest.get("body") or f"{incident['status']}, {incident.get('impact', '')} impact",
        )
    return ET.tostring(feed, encoding="utf-8", xml_declaration=True)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
