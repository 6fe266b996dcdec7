"""The HTTP/1.1 server the API is served with: uvicorn's httptools protocol, with two things production
servers do that it does not.

- A request whose headers have not all arrived within `HEADER_TIMEOUT_S` of its first byte (or of the
  connection, before any byte) is closed, as nginx's `client_header_timeout` and Node's `headersTimeout`
  do: a client trickling one header line every few seconds no longer holds a connection for ever.
- A request the HTTP parser refuses (a control character in a header value, a malformed request line) is
  answered as every other error is, a `400 MALFORMED_REQUEST` problem document, not uvicorn's text/plain.

And an idle kept-alive connection stays open `KEEP_ALIVE_S`, not uvicorn's 5 s: the service tells clients to
come back after 5 s (`retryAfterMs` of an assignment while the signer or the clock is not ready), and a
client that does so on its kept connection met the server closing it at that very moment (a reset).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gasless.core.errors import PROBLEM_MEDIA_TYPE, ApiError, problem_document
from gasless.http.problems import REQUEST_ID_HEADER, new_request_id

HEADER_TIMEOUT_S = 10.0
# Longer than the retry hints a client follows on the same connection (at most 60 s), as nginx's default.
KEEP_ALIVE_S = 75


def http_protocol(docs_url: str, header_timeout_s: float = HEADER_TIMEOUT_S) -> type[HttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, rendering its refusals with `docs_url`."""

    class GaslessHttpProtocol(HttpToolsProtocol):
        _headers_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_headers()  # a connection that never sends a byte is a request without headers too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_headers()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_headers()

        def on_headers_complete(self) -> None:
            self._disarm_headers()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Idle between requests is the keep-alive timeout's; the next request re-arms at its first byte.
            self._disarm_headers()

        def _arm_headers(self) -> None:
            self._disarm_headers()
            self._headers_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm_headers(self) -> None:
            if self._headers_timer is not None:
                self._headers_timer.cancel()
                self._headers_timer = None

        def _headers_late(self) -> None:
            self._headers_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            request_id = new_request_id()
            error = ApiError(
                "MALFORMED_REQUEST",
                detail="the request is not valid HTTP/1.1 (a control character in a header value, a malformed "
                "request line or header)",
                details={"field": "headers"},
            )
            body = json.dumps(
                problem_document(error, docs_url=docs_url, request_id=request_id), separators=(",", ":")
            ).encode()
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head.append(name + b": " + value + b"\r\n")
            head += [
                b"content-type: " + PROBLEM_MEDIA_TYPE.encode() + b"\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                REQUEST_ID_HEADER.lower().encode() + b": " + request_id.encode() + b"\r\n",
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return GaslessHttpProtocol


def api_server_config(
    app: Any, *, docs_url: str, header_timeout_s: float = HEADER_TIMEOUT_S, **options: Any
) -> uvicorn.Config:
    """uvicorn's configuration for the API (the tests serve it the same way)."""
    return uvicorn.Config(
        app, http=http_protocol(docs_url, header_timeout_s), **{"timeout_keep_alive": KEEP_ALIVE_S, **options}
    )
