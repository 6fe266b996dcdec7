"""Account-stream event ids are host-specific and process-specific (spec: not resumable across hosts or
restarts)."""

from __future__ import annotations

from pathlib import Path

from gasless.app import HostState
from gasless.settings import Settings


def test_event_ids_resume_only_on_the_process_that_issued_them(tmp_path: Path) -> None:
    a = HostState(settings=Settings(data_dir=tmp_path, host_id="a"), boot_epoch_ms=1_700_000_000_000)
    b = HostState(settings=Settings(data_dir=tmp_path, host_id="b"), boot_epoch_ms=1_700_000_000_000)
    restarted = HostState(settings=a.settings, boot_epoch_ms=1_700_000_000_001)
    issued = a.stream_event_id(42)
    assert issued == "a.1700000000000.42"
    assert a.resumable_seq(issued) == 42
    assert b.resumable_seq(issued) is None  # from the other host
    assert restarted.resumable_seq(issued) is None  # from before a restart
    for junk in (None, "", "42", "a.1700000000000", "a.1700000000000.x", "a.1700000000000.-1"):
        assert a.resumable_seq(junk) is None
