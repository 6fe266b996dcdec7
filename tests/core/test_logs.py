"""Log redaction (by member name and by value pattern) and the one JSON pipeline for every logger."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gasless.core.logs import MASK, Redactor, configure_logging

SIGNATURE = "ab" * 64
TX_HASH = "cd" * 32
ADDRESS = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
LEASE = "eyJ2IjoxLCJlbnYiOiJ0ZXN0IiwiY2hhaW5JZCI6ImxvY2FsbmV0In0.Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0"
NATIVE_AUTH = "ZXJkMXF5dTV3dGhsZHpyOHd4NWM5dWNn.Ykd4dlkyRnNhRzl6ZERvek1EQXc." + "ef" * 64
MASTER = "m" * 20 + "-the-master-secret-" + "z" * 20


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """configure_logging into a buffer at DEBUG; the previous logging set-up is restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    buffer = io.StringIO()
    configure_logging(json_lines=True, level="DEBUG", secrets=[MASTER], stream=buffer)
    try:
        yield buffer
    finally:
        structlog.configure(**config)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        structlog.contextvars.clear_contextvars()


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


@pytest.mark.parametrize(
    "name",
    ["signature", "relayerSignature", "guardianSignature", "lease", "token", "Authorization", "X-Api-Key",
     "api_key", "master_secret", "client_secret", "password", "native_auth_token", "Cookie"],
)  # fmt: skip
def test_sensitive_member_names_are_masked_whatever_the_value(name: str) -> None:
    event = Redactor()(None, "info", {"event": "x", name: "plain", "nested": {name: 1, "ok": 2}})
    assert event[name] == MASK and event["nested"] == {name: MASK, "ok": 2}


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"sig {SIGNATURE} end", SIGNATURE),
        (f"lease {LEASE}", LEASE),
        (f"token={NATIVE_AUTH}", NATIVE_AUTH),
        ("Authorization: Bearer abc.def-123_xyz", "abc.def-123_xyz"),
        ("key gls_test_4f9a8b7c6d5e and more", "gls_test_4f9a8b7c6d5e"),
        ("key gls_live_0123456789abcdef", "gls_live_0123456789abcdef"),
        ("postgresql+asyncpg://svc:hunter2pass@db:5432/gasless", "hunter2pass"),
        (f"boot with {MASTER}!", MASTER),
        ("""{'signature': 'short', "lease": "also-short"}""", "short"),
        ('{"relayerSignature": "0123"}', "0123"),
    ],
)
def test_secret_values_are_masked_inside_any_text(text: str, secret: str) -> None:
    masked = Redactor([MASTER]).text(text)
    assert secret not in masked and MASK in masked, masked


def test_public_identifiers_stay_readable() -> None:
    text = f"intent {ADDRESS}:7 hash {TX_HASH} module gasless.relay.jobs at 2026-01-01T00:00:00.123Z"
    assert Redactor([MASTER]).text(text) == text


def test_a_string_is_judged_the_same_however_often_it_is_logged() -> None:
    # Clean strings are remembered (logs.py); what needed masking must be masked every time, and a label
    # seen before the cache filled up comes back unchanged after it was emptied.
    redactor = Redactor([MASTER])
    short_secrets = ["Bearer abc.def-123_xyz", "key gls_test_4f9a8b7c6d5e", '{"relayerSignature": "0123"}']
    for _ in range(3):
        for text in short_secrets:
            assert MASK in redactor.text(text)
        assert redactor.text(MASTER) == MASK
        assert redactor.text("request") == "request" and redactor.text("/v1/relay") == "/v1/relay"
    for index in range(5000):  # request ids and timestamps: more distinct clean strings than the cache holds
        assert redactor.text(f"req_{index:016x}") == f"req_{index:016x}"
    assert redactor.text("request") == "request"
    for text in short_secrets:
        assert MASK in redactor.text(text)


def test_values_of_any_shape_are_redacted() -> None:
    event = Redactor()(
        None,
        "info",
        {"event": "e", "tx": {"nonce": 1, "signature": SIGNATURE}, "list": [SIGNATURE, 3], "raw": bytes(64)},
    )
    assert event["tx"] == {"nonce": 1, "signature": MASK}
    assert event["list"] == [MASK, 3]
    assert event["raw"] == MASK  # 64 bytes as hex is a 128-hex blob


def test_every_logger_writes_redacted_json_with_the_request_context(captured: io.StringIO) -> None:
    structlog.contextvars.bind_contextvars(request_id="req_0123", host_id="b")
    structlog.get_logger("gasless.test").info("relayed", lease=LEASE, note=f"sig {SIGNATURE}")
    logging.getLogger("some.library").debug("sent %s with %s", {"signature": SIGNATURE}, MASTER)
    try:
        raise ValueError(f"could not parse {LEASE}")
    except ValueError:
        structlog.get_logger("gasless.test").exception("failed")
    text = captured.getvalue()
    assert SIGNATURE not in text and LEASE not in text and MASTER not in text
    ours, library, failure = lines(captured)
    assert ours["event"] == "relayed" and ours["lease"] == MASK and ours["note"] == f"sig {MASK}"
    assert library["logger"] == "some.library" and library["level"] == "debug"
    for line in (ours, library, failure):
        assert line["request_id"] == "req_0123" and line["host_id"] == "b" and line["timestamp"]
    assert "ValueError: could not parse [redacted]" in failure["exception"]


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError):
        configure_logging(json_lines=True, level="LOUD")
