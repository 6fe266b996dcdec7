"""Account-stream event ids are host-specific and process-specific (docs/streams.md: not resumable across
hosts or restarts)."""

from __future__ import annotations

from pathlib import Path

from gasless.core.settings import Settings
from gasless.hosting.app import HostState, create_app


def test_event_ids_resume_only_on_the_process_that_issued_them(tmp_path: Path) -> None:
    def host(host_id: str, boot_epoch_ms: int) -> HostState:
        state: HostState = create_app(Settings(data_dir=tmp_path, host_id=host_id)).state.host
        state.boot_epoch_ms = boot_epoch_ms
        return state

    a = host("a", 1_700_000_000_000)
    b = host("b", 1_700_000_000_000)
    restarted = host("a", 1_700_000_000_001)
    issued = a.stream_event_id(42)
    assert issued == "a.1700000000000.42"
    assert a.resumable_seq(issued) == 42
    assert b.resumable_seq(issued) is None  # from the other host
    assert restarted.resumable_seq(issued) is None  # from before a restart
    for junk in (None, "", "42", "a.1700000000000", "a.1700000000000.x", "a.1700000000000.-1"):
        assert a.resumable_seq(junk) is None
