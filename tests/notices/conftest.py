"""Notice test fixtures (defined in notice_kit)."""

from notice_kit import (  # noqa: F401
    env,
    make_env,
    platform_problem,
    problem,
    receiver,
    receiver_factory,
    served,
    smtp,
    sse,
    unpaused_localnet,
)
