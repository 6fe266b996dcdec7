"""The status site (`gasless status-site`): its own process and port, reading only the feed files the API
publishes (never the database), so it keeps serving the last feeds while the API is down and says how old
they are. Routes: `/` (the page), `/feed/status.json`, `/feed/incidents.json`, `/feed/telemetry.json`,
`/feed/incidents.atom`, `/healthz`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gasless.statussite.render import atom, page

FEEDS = ("status.json", "incidents.json", "telemetry.json")


def _read(directory: Path, name: str) -> tuple[bytes, float] | None:
    path = directory / name
    try:
        return path.read_bytes(), path.stat().st_mtime
    except OSError:
        return None


def _json(directory: Path, name: str) -> dict[str, Any] | None:
    found = _read(directory, name)
    if found is None:
        return None
    try:
        document = json.loads(found[0])
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def create_status_site(feed_dir: Path, *, site_url: str = "", site_name: str = "gasless") -> Starlette:
    async def feed(request: Request) -> Response:
        name = request.path_params["name"]
        found = _read(feed_dir, name) if name in FEEDS else None
        if found is None:
            return JSONResponse({"error": f"no feed {name} has been published"}, status_code=404)
        body, mtime = found
        age_ms = max(0, int((time.time() - mtime) * 1000))
        return Response(
            body,
            media_type="application/json",
            headers={"Cache-Control": "public, max-age=30", "X-Feed-Age-Ms": str(age_ms)},
        )

    async def incidents_atom(request: Request) -> Response:
        found = _read(feed_dir, "incidents.json")
        # The feed's time without incidents: when the API published the incidents (else now).
        generated_ms = int((found[1] if found is not None else time.time()) * 1000)
        body = atom(
            _json(feed_dir, "incidents.json"),
            site_url or str(request.base_url).rstrip("/"),
            site_name,
            generated_ms,
        )
        return Response(
            body,
            media_type="application/atom+xml",
            headers={"Cache-Control": "public, max-age=30"},
        )

    async def home(request: Request) -> HTMLResponse:
        html = page(
            _json(feed_dir, "status.json"),
            _json(feed_dir, "incidents.json"),
            int(time.time() * 1000),
            site_name,
        )
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    async def health(request: Request) -> JSONResponse:
        # `service` tells a client that took this for another endpoint (`gasless ... --api`) what it is.
        return JSONResponse({"status": "ok", "service": "status-site"})

    return Starlette(
        routes=[
            Route("/", home),
            Route("/feed/incidents.atom", incidents_atom),
            Route("/feed/{name}", feed),
            Route("/healthz", health),
        ]
    )
