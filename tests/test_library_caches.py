"""A finished test's relay host and localnet can be collected once the suite empties the library caches
(tests/library_caches.py): a test worker that kept them grew until its garbage collections stalled it."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from library_caches import clear_library_caches
from relay_kit import load_conftest, start_env  # type: ignore[import-not-found]

from gasless.localnet.chain import LocalChain


def _serve_one_relay_host(tmp_path: Path) -> tuple[weakref.ref[Any], weakref.ref[Any]]:
    """Start a localnet and a host on it, ask the host something that reaches the gateway, stop both; weak
    references to the host's app and to the localnet's chain (held by nothing of the test's own)."""
    running_localnet = load_conftest(".").RunningLocalnet
    with running_localnet(tmp_path / "localnet", round_ms=100, gateways=1) as localnet:
        chain = weakref.ref(localnet.net.chain)
        envs = start_env(tmp_path, localnet)
        try:
            env = next(envs)
            assert env.assign(env.new_sender(0))["relayer"]
            app = weakref.ref(env.client.app)
        finally:
            envs.close()
    return app, chain


def test_a_stopped_host_and_localnet_are_collected_after_the_caches_are_emptied(tmp_path: Path) -> None:
    app, chain = _serve_one_relay_host(tmp_path)
    gc.collect()
    # Without the emptying, the libraries still hold both (the reason the suite empties them).
    assert isinstance(app(), FastAPI)
    assert isinstance(chain(), LocalChain)
    clear_library_caches()
    gc.collect()
    assert app() is None, gc.get_referrers(app())
    assert chain() is None, gc.get_referrers(chain())
