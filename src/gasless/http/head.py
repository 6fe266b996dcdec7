"""HEAD wherever GET is served (RFC 9110 section 9.3.2), in one place for every route.

FastAPI routes answer only the methods they declare, so without this a HEAD on any GET route was a 404.
This pure-ASGI middleware runs a HEAD request as the GET it stands for and answers that GET's status and
headers (`Content-Length`, `ETag`, `Cache-Control`, `RateLimit-*`, ... as GET would send them) with no
body. It adds no routes: the OpenAPI document lists each GET once and no HEAD operations.

The answer ends with the GET's headers. A streaming GET (Server-Sent Events, CSV) is then told the client
has gone (`http.disconnect`), so an event stream stops at once instead of streaming into the void until
its own end; whatever body it still sends is dropped.
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        # A copy: the server keeps reading its own scope's method (HEAD) to frame the answer.
        as_get = {**scope, "method": "GET"}
        answered = anyio.Event()
        request_read = False

        async def receive_head() -> Message:
            nonlocal request_read
            if not request_read:
                message = await receive()
                request_read = message["type"] != "http.request" or not message.get("more_body", False)
                return message
            await answered.wait()  # after the headers nobody listens: the stream stops
            return {"type": "http.disconnect"}

        async def send_head(message: Message) -> None:
            if answered.is_set():
                return  # the body of the GET (or the rest of a stream): not part of a HEAD answer
            if message["type"] == "http.response.start":
                # What routing found (the route, its parameters) is visible to the outer layers (metrics,
                # access log), as for any other request.
                scope.update({key: value for key, value in as_get.items() if key != "method"})
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                answered.set()
                return
            await send(message)

        await self.app(as_get, receive_head, send_head)
