"""Library caches that keep a finished test's hosts and localnets alive, and how the suite empties them.

FastAPI classifies every endpoint and dependency callable once and keeps the answer in bounded module-level
caches keyed by the callable (4 096 entries each); the endpoints are closures over their app, so each cache
holds up to ~60 whole apps with their services, engines and caches. aiohttp caches the middleware chain of
each (handler, applications) pair (1 024 entries), and a localnet's gateway application holds its chain, so
that cache holds dozens of localnets with every block they made. One process serves one app in production and
never notices; a test worker starts hundreds. Left alone, a worker grew to millions of objects and a full
garbage collection, which stops every thread of the process, took seconds: long enough for a localnet served
in the same process to miss the relay host's 5 s gateway timeout (a CI failure: `UPSTREAM_UNAVAILABLE`
where the test expected `NONCE_GAP`).

The names are private to those libraries and their versions are pinned in the lock file; an upgrade that
renames one fails `tests/test_library_caches.py` loudly rather than letting the growth come back unnoticed.
"""

from __future__ import annotations

import aiohttp.web_app
import fastapi.dependencies.models

_FASTAPI_CACHES = (
    "_is_gen_callable_cached",
    "_is_async_gen_callable_cached",
    "_is_coroutine_callable_cached",
)


def clear_library_caches() -> None:
    """Forget every callable and application the caches above hold (they refill on the next request)."""
    for name in _FASTAPI_CACHES:
        getattr(fastapi.dependencies.models, name).cache_clear()
    aiohttp.web_app._cached_build_middleware.cache_clear()
