"""A clock the test moves itself, for code that takes its clock (`clock=...`): time passes when the test
says, whatever the machine's speed between two steps."""

from __future__ import annotations


class ManualClock:
    """Seconds, like `time.time` and `time.monotonic`; still until `advance` or an assignment to `now`."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000
