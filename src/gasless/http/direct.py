"""Direct routes: a hot operation served as plain ASGI, before FastAPI's router and dependency solving.

The operation stays declared on its FastAPI router (the OpenAPI document, its schemas and problem documents
come from there); this layer answers the same method and path first, with a handler that takes the Request
and returns the Response, doing what the declared route's dependencies did itself. It sits innermost among
the app's middlewares, so request ids, metrics, RateLimit headers, origins and the body limit apply as to
every route. An ApiError is rendered by the one problem renderer; anything else propagates to the app's
outermost error handler, exactly as from a FastAPI route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gasless.core.errors import ApiError
from gasless.http.problems import problem_response

DirectHandler = Callable[[Request], Awaitable[Response]]


def declared_route(routes: Iterable[object], operation_id: str) -> APIRoute:
    """The FastAPI route that documents an operation (its router's, by operation id)."""
    for route in routes:
        if isinstance(route, APIRoute) and route.operation_id == operation_id:
            return route
    raise LookupError(f"no route declares {operation_id}")


class DirectRoutes:
    def __init__(
        self, app: ASGIApp, *, routes: Iterable[tuple[APIRoute, DirectHandler]], docs_url: str
    ) -> None:
        self.app = app
        self.routes = {
            (method, route.path): (route, handler) for route, handler in routes for method in route.methods
        }
        self.docs_url = docs_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if direct is None:
            await self.app(scope, receive, send)
            return
        route, handler = direct
        scope["route"] = route  # as the router would set it: the metrics' route label, the access log
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except ApiError as exc:
            response = problem_response(request, exc, self.docs_url)
        await response(scope, receive, send)
