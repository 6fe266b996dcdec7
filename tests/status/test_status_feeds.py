"""The status site's feeds as a feed reader and a browser's discovery see them: a served API on localnet
publishes the feed files, `gasless status-site` serves them as its own process.

The Atom feed is read by a real feed parser (feedparser: strict XML parse, `bozo` false, Atom 1.0) and the
elements RFC 4287 requires are checked explicitly: the feed's id, title, updated and author (4.1.1), each
entry's id, title, updated and, without content, an alternate link (4.1.2); ids are absolute IRIs that never
change, never URLs that do not answer. An empty feed's `updated` is when the incidents were published, not
1970. The page announces the feed (`<link rel="alternate" type="application/atom+xml">`), links every feed,
and explains its columns."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from xml.etree import ElementTree as ET

import feedparser
import pytest
import requests
from process_kit import answers, free_port, run, spawn  # type: ignore[import-not-found]
from relay_kit import ServedApi  # type: ignore[import-not-found]

from gasless.hosting.app import create_app

ATOM = "{http://www.w3.org/2005/Atom}"


def _wait(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)
    return value


def _when(text: str) -> float:
    """An RFC 3339 date-time (as Atom's Date constructs are), in seconds since the epoch."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def valid_atom(body: bytes) -> ET.Element:
    """The feed, once a strict parser read it as Atom 1.0 and RFC 4287's required elements are there."""
    parsed = feedparser.parse(body)
    assert not parsed.bozo, f"not well-formed: {parsed.get('bozo_exception')!r}\n{body.decode()}"
    assert parsed.version == "atom10", parsed.version
    feed = ET.fromstring(body)
    assert feed.tag == f"{ATOM}feed"

    def one(parent: ET.Element, name: str) -> ET.Element:
        found = parent.findall(f"{ATOM}{name}")
        assert len(found) == 1, f"{parent.tag} has {len(found)} <{name}>"
        return found[0]

    def absolute_iri(text: str | None) -> str:
        assert text and urlparse(text).scheme, f"not an absolute IRI: {text!r}"
        return text

    ids = [absolute_iri(one(feed, "id").text)]
    assert (one(feed, "title").text or "").strip()
    _when(one(feed, "updated").text or "")
    entries = feed.findall(f"{ATOM}entry")
    authors = feed.findall(f"{ATOM}author")
    assert authors or all(e.findall(f"{ATOM}author") for e in entries), "no author (RFC 4287 4.1.1)"
    assert all((a.findtext(f"{ATOM}name") or "").strip() for a in authors)
    assert [link for link in feed.findall(f"{ATOM}link") if link.get("rel") == "self"]
    for entry in entries:
        ids.append(absolute_iri(one(entry, "id").text))
        assert (one(entry, "title").text or "").strip()
        _when(one(entry, "updated").text or "")
        alternates = [link for link in entry.findall(f"{ATOM}link") if link.get("rel") == "alternate"]
        assert entry.findall(f"{ATOM}content") or alternates, "entry without content or alternate link"
    assert len(set(ids)) == len(ids), ids
    return feed


class _Page(HTMLParser):
    """The elements of the page a test reads: head links, anchors, table headers, captions, figcaptions."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []
        self.anchors: list[str] = []
        self.headers: list[dict[str, str | None]] = []
        self.ids: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.add(str(attributes["id"]))
        if tag == "link":
            self.links.append(attributes)
        elif tag == "a" and attributes.get("href"):
            self.anchors.append(str(attributes["href"]))
        elif tag == "th":
            self.headers.append(attributes)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture
def published(make_env: Any, tmp_path: Path, unpaused_localnet: Any) -> Iterator[tuple[Any, Path]]:
    """The API publishing its feeds every 200 ms into a directory; (settings, that directory)."""
    feed = tmp_path / "feeds"
    settings = make_env.__globals__["relay_settings"](
        tmp_path, unpaused_localnet, status_feed_dir=feed, status_feed_ms=200
    )
    api = ServedApi(create_app(settings)).start()
    try:
        _wait(lambda: (feed / "incidents.json").exists(), "the first publication")
        yield settings, feed
    finally:
        api.stop()


def test_the_atom_feed_is_valid_atom_and_the_page_announces_it(
    published: tuple[Any, Path], tmp_path: Path
) -> None:
    settings, feed = published
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with spawn(
        "status-site", "--feed-dir", str(feed), "--port", str(port), log=tmp_path / "site.log"
    ) as site:
        site.wait_for(lambda: answers(f"{url}/healthz"), "the status site")

        # No incident yet: a valid feed without entries, updated when the incidents were published.
        empty = requests.get(f"{url}/feed/incidents.atom", timeout=5)
        assert empty.status_code == 200 and empty.headers["content-type"].startswith("application/atom+xml")
        document = valid_atom(empty.content)
        assert document.findall(f"{ATOM}entry") == []
        updated = _when(document.findtext(f"{ATOM}updated") or "")
        published_at = (feed / "incidents.json").stat().st_mtime
        assert abs(updated - published_at) < 2 and "1970" not in empty.text, empty.text

        # An incident with two updates, declared as the operator does.
        database = ["--database-url", settings.effective_database_url]
        opened = run(
            "admin", "incident", "open", "--title", "Slow inclusion", "--body", "Looking", "--json", *database
        )
        assert opened.returncode == 0, opened.stdout + opened.stderr
        incident = json.loads(opened.stdout)
        updated_cli = run(
            "admin", "incident", "update", incident["id"], "--status", "identified", "--body", "A gateway",
            "--json", *database,
        )  # fmt: skip
        assert updated_cli.returncode == 0, updated_cli.stdout + updated_cli.stderr
        last_change = json.loads(updated_cli.stdout)["updatedAtMs"]

        def listed() -> bytes | None:
            answer = requests.get(f"{url}/feed/incidents.atom", timeout=5)
            return answer.content if b"[identified] Slow inclusion" in answer.content else None

        document = valid_atom(_wait(listed, "the incident in the feed"))
        (entry,) = document.findall(f"{ATOM}entry")
        assert _when(document.findtext(f"{ATOM}updated") or "") == last_change // 1000
        assert entry.findtext(f"{ATOM}summary") == "A gateway"
        entry_id = entry.findtext(f"{ATOM}id") or ""
        assert entry_id.startswith("urn:uuid:") and incident["id"] not in entry_id, entry_id
        # The entry's alternate link answers: the page, with the incident's article at its fragment.
        (link,) = [x for x in entry.findall(f"{ATOM}link") if x.get("rel") == "alternate"]
        target = urlparse(link.get("href") or "")
        assert target.fragment == incident["id"], link.attrib
        page_answer = requests.get(target._replace(fragment="").geturl(), timeout=5)
        assert page_answer.status_code == 200
        # Ids never change: read again, the same.
        again = valid_atom(requests.get(f"{url}/feed/incidents.atom", timeout=5).content)
        assert [e.findtext(f"{ATOM}id") for e in again.findall(f"{ATOM}entry")] == [entry_id]

        # The page: feed discovery in its head, every feed linked (and answering), its columns explained.
        page = _Page()
        page.feed(page_answer.text)
        assert incident["id"] in page.ids
        atom_links = [
            x for x in page.links if x.get("rel") == "alternate" and x.get("type") == "application/atom+xml"
        ]
        assert [x.get("href") for x in atom_links] == ["/feed/incidents.atom"], page.links
        for name in ("incidents.atom", "status.json", "incidents.json", "telemetry.json"):
            assert f"/feed/{name}" in page.anchors, page.anchors
            assert requests.get(f"{url}/feed/{name}", timeout=5).status_code == 200
        floats = [h for h in page.headers if h.get("class") == "float"]
        assert floats and "never a balance" in str(floats[0].get("title")), page.headers
        text = "".join(page.text)
        assert "Relayer float: whether the shard's relayers hold enough EGLD" in text
        assert "(1 samples)" not in text and "samples)" in text
