"""Native-auth tokens: our verifier and token maker, cross-checked against the SDK's NativeAuthClient/Server."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multiversx_sdk import Account, Message, UserSecretKey
from multiversx_sdk.native_auth import (
    NativeAuthClient,
    NativeAuthClientConfig,
    NativeAuthServer,
    NativeAuthServerConfig,
)

from gasless.auth.native_auth import (
    MAX_TOKEN_CHARS,
    TOKEN_EXPIRED,
    TOKEN_INVALID,
    NativeAuthError,
    NativeAuthIdentity,
    NativeAuthVerifier,
)
from gasless.client.native_auth import make_native_auth_token

ORIGIN = "https://app.example.com"
BLOCK = "a1" * 32
OTHER_BLOCK = "b2" * 32
ISSUED_MS = 1_700_000_000_000

# Fixed keys, so failures reproduce.
KEY = UserSecretKey(bytes(range(32)))
OTHER_KEY = UserSecretKey(bytes(range(1, 33)))
ADDRESS = Account(KEY).address.to_bech32()


class FakeBlocks:
    """A BlockLookup over a dict of hash -> timestamp_ms; counts hash lookups."""

    def __init__(self, blocks: dict[str, int] | None = None, latest_ms: int | None = None) -> None:
        self.blocks = dict(blocks if blocks is not None else {BLOCK: ISSUED_MS})
        self.latest_ms = latest_ms if latest_ms is not None else max(self.blocks.values(), default=None)
        self.hash_lookups = 0

    def timestamp_ms(self, block_hash: str) -> int | None:
        self.hash_lookups += 1
        return self.blocks.get(block_hash)

    def latest_timestamp_ms(self) -> int | None:
        return self.latest_ms


def b64url(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def unb64url(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


def signed_token(
    key: UserSecretKey = KEY,
    *,
    origin: str = ORIGIN,
    block_hash: str = BLOCK,
    ttl: int | str = 3600,
    extra_json: str = "{}",
    suffix: str = "",
    raw: bool = False,
) -> str:
    """A token assembled by hand around a real signature (wallet message, or raw Ed25519 when `raw`)."""
    account = Account(key)
    address = account.address.to_bech32()
    body = f"{b64url(origin)}.{block_hash}.{ttl}.{b64url(extra_json)}"
    signed = f"{address}{body}{suffix}".encode()
    signature = key.sign(signed) if raw else account.sign_message(Message(signed))
    return f"{b64url(address)}.{b64url(body)}.{signature.hex()}"


def verifier(blocks: FakeBlocks | None = None, **kwargs: Any) -> NativeAuthVerifier:
    kwargs.setdefault("accepted_origins", [ORIGIN])
    return NativeAuthVerifier(blocks if blocks is not None else FakeBlocks(), **kwargs)


def assert_rejected(v: NativeAuthVerifier, token: Any, code: str = TOKEN_INVALID) -> NativeAuthError:
    with pytest.raises(NativeAuthError) as info:
        v.verify(token)
    assert info.value.code == code, info.value.message
    return info.value


# Round trip ---------------------------------------------------------------------------------------------
def test_round_trip() -> None:
    token = make_native_auth_token(
        KEY, origin=ORIGIN, block_hash=BLOCK, ttl_seconds=600, extra_info={"timestamp": 1, "x": "y"}
    )
    identity = verifier().verify(token)
    assert identity == NativeAuthIdentity(
        address=ADDRESS,
        origin=ORIGIN,
        block_hash=BLOCK,
        ttl_seconds=600,
        issued_ms=ISSUED_MS,
        expires_ms=ISSUED_MS + 600_000,
        extra_info={"timestamp": 1, "x": "y"},
    )


def test_token_format() -> None:
    token = make_native_auth_token(KEY, origin=ORIGIN, block_hash=BLOCK, ttl_seconds=60)
    address_part, body_part, signature = token.split(".")
    assert unb64url(address_part) == ADDRESS
    assert unb64url(body_part) == f"{b64url(ORIGIN)}.{BLOCK}.60.e30"
    assert len(signature) == 128 and "=" not in token
    assert token == signed_token(ttl=60)  # the wallet-message signature is deterministic


def test_padded_base64_accepted() -> None:
    address_part, body_part, signature = signed_token().split(".")

    def pad(s: str) -> str:
        return s + "=" * (-len(s) % 4)

    assert pad(address_part) != address_part or pad(body_part) != body_part
    assert verifier().verify(f"{pad(address_part)}.{pad(body_part)}.{signature}").address == ADDRESS


def test_uppercase_signature_and_block_hash_hex() -> None:
    token = signed_token(block_hash=BLOCK.upper())
    a, b, s = token.split(".")
    identity = verifier().verify(f"{a}.{b}.{s.upper()}")
    assert identity.block_hash == BLOCK


def test_legacy_braces_variant_accepted() -> None:
    assert verifier().verify(signed_token(suffix="{}")).address == ADDRESS


def test_invalid_arguments_to_maker() -> None:
    with pytest.raises(ValueError):
        make_native_auth_token(KEY, origin=ORIGIN, block_hash="not-a-hash")
    with pytest.raises(ValueError):
        make_native_auth_token(KEY, origin=ORIGIN, block_hash=BLOCK, ttl_seconds=-1)


# Rules -------------------------------------------------------------------------------------------------
def test_wrong_origin() -> None:
    err = assert_rejected(verifier(), signed_token(origin="https://evil.example.org"))
    assert "origin" in err.message


@pytest.mark.parametrize(
    ("accepted", "origin", "ok"),
    [
        (["*"], "anything at all", True),
        (["https://app.example.com"], "app.example.com", True),  # bare host, like NativeAuthServer
        (["https://app.example.com"], "http://app.example.com", False),
        (["https://app.example.com"], "https://app.example.com/", False),
        (["https://*.example.com"], "https://a.example.com", True),
        (["https://*.example.com"], "https://a.b.example.com", True),
        (["https://*.example.com"], "http://a.example.com", False),
        (["https://*.example.com"], "https://example.com", False),
        (["https://*.example.com"], "https://.example.com", False),
        (["https://*.example.com"], "https://evil.org/x.example.com", False),
        (["https://*.example.com"], "https://evil.org?.example.com", False),
        (["*.example.com"], "a.example.com", True),
        (["*.example.com"], "https://a.example.com", True),
        (["*.example.com"], "https://evil.org/.example.com", False),
    ],
)
def test_origin_rules(accepted: list[str], origin: str, ok: bool) -> None:
    v = verifier(accepted_origins=accepted)
    assert v.is_origin_accepted(origin) is ok
    token = signed_token(origin=origin)
    if ok:
        assert v.verify(token).origin == origin
    else:
        assert_rejected(v, token)


@pytest.mark.parametrize(
    "bad", [[], "https://a.com", ["https://*.a.*.com"], ["ftp://*.a.com"], ["https://*a.com"]]
)
def test_bad_configuration(bad: Any) -> None:
    with pytest.raises(ValueError):
        NativeAuthVerifier(FakeBlocks(), accepted_origins=bad)


def test_bad_max_ttl() -> None:
    for bad in (0, 86_401):
        with pytest.raises(ValueError):
            verifier(max_ttl_seconds=bad)


def test_unknown_block() -> None:
    err = assert_rejected(verifier(), signed_token(block_hash=OTHER_BLOCK))
    assert "unknown block" in err.message


def test_expiry_on_the_chain_clock() -> None:
    blocks = FakeBlocks()
    v = verifier(blocks)
    token = signed_token(ttl=60)
    blocks.latest_ms = ISSUED_MS + 60_000  # exactly at expiry: still valid (NativeAuthServer uses <)
    assert v.verify(token).expires_ms == ISSUED_MS + 60_000
    blocks.latest_ms = ISSUED_MS + 60_001
    err = assert_rejected(v, token, TOKEN_EXPIRED)  # cached, but expiry is re-checked
    assert "expired" in err.message
    assert_rejected(verifier(blocks), token, TOKEN_EXPIRED)  # and uncached


def test_ttl_limit() -> None:
    v = verifier(max_ttl_seconds=3600)
    assert v.verify(signed_token(ttl=3600)).ttl_seconds == 3600
    assert_rejected(v, signed_token(ttl=3601))
    assert_rejected(verifier(), signed_token(ttl=86_401))


@pytest.mark.parametrize("ttl", ["-1", "+60", " 60", "6_0", "٦٠", "60.0", "", "99999999999"])
def test_ttl_must_be_plain_decimal(ttl: str) -> None:
    assert_rejected(verifier(), signed_token(ttl=ttl))


@pytest.mark.parametrize("extra", ["[]", '"e30"', "1", "null", "{", "{'a': 1}"])
def test_extra_info_must_be_a_json_object(extra: str) -> None:
    assert_rejected(verifier(), signed_token(extra_json=extra))


# Tampering --------------------------------------------------------------------------------------------
def test_tampered_body() -> None:
    address_part, body_part, signature = signed_token(ttl=60).split(".")
    body = unb64url(body_part).replace(".60.", ".61.")
    assert_rejected(verifier(), f"{address_part}.{b64url(body)}.{signature}")


def test_tampered_signature() -> None:
    address_part, body_part, signature = signed_token().split(".")
    flipped = ("0" if signature[10] != "0" else "1").join((signature[:10], signature[11:]))
    err = assert_rejected(verifier(), f"{address_part}.{body_part}.{flipped}")
    assert signature not in err.message and flipped not in err.message


def test_address_swap() -> None:
    _, body_part, signature = signed_token().split(".")
    other = Account(OTHER_KEY).address.to_bech32()
    assert_rejected(verifier(), f"{b64url(other)}.{body_part}.{signature}")


def test_raw_ed25519_signature_rejected() -> None:
    assert_rejected(verifier(), signed_token(raw=True))
    assert_rejected(verifier(), signed_token(raw=True, suffix="{}"))


def test_other_suffix_rejected() -> None:
    assert_rejected(verifier(), signed_token(suffix="{ }"))


# Garbage ----------------------------------------------------------------------------------------------
GOOD = signed_token()
GOOD_A, GOOD_B, GOOD_S = GOOD.split(".")
NOT_UTF8 = base64.urlsafe_b64encode(b"\xff\xfe.x.1.e30").decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        "",
        ".",
        "..",
        "a.b",
        "a.b.c.d",
        f"{GOOD_A}.{GOOD_B}",
        f"{GOOD_A}.{GOOD_B}.zz" + GOOD_S[2:],
        f"{GOOD_A}.{GOOD_B}.{GOOD_S[:-2]}",
        f"{GOOD_A}.{GOOD_B}.{GOOD_S}00",
        f"{GOOD_A}.{GOOD_B}. {GOOD_S[1:]}",
        f"{GOOD_A}.{GOOD_B}.{GOOD_S}.",
        f"{GOOD_A}!.{GOOD_B}.{GOOD_S}",
        f"{GOOD_A}.{GOOD_B[:-1]}.{GOOD_S}",
        f"{GOOD_A}.{GOOD_B}===.{GOOD_S}",
        f"{GOOD_A}.{GOOD_B}.{GOOD_S}=",
        f"{GOOD_A}.{GOOD_B[:5]}+{GOOD_B[6:]}.{GOOD_S}",
        f"{GOOD_A}.{GOOD_B[:5]}/{GOOD_B[6:]}.{GOOD_S}",
        f"{b64url('erd1notanaddress')}.{GOOD_B}.{GOOD_S}",
        f"{b64url(ADDRESS.upper())}.{GOOD_B}.{GOOD_S}",
        f"{GOOD_A}.{b64url('a.b.c')}.{GOOD_S}",
        f"{GOOD_A}.{NOT_UTF8}.{GOOD_S}",
        GOOD + "x" * (MAX_TOKEN_CHARS - len(GOOD) + 1),
        "a" * 1_000_000,
        f"{GOOD_A}.{b64url('e30.' + BLOCK + '.60.' + b64url('[' * 2000 + ']' * 2000))}.{GOOD_S}",
    ],
)
def test_garbage_is_token_invalid(token: str) -> None:
    assert_rejected(verifier(), token)


@pytest.mark.parametrize("token", [None, b"abc", 123, ["a", "b", "c"], GOOD.encode()])
def test_non_string_is_token_invalid(token: Any) -> None:
    assert_rejected(verifier(), token)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), st.text(alphabet="abcdefABCDEF0123456789-_.=e3").map(lambda s: s * 3)))
def test_fuzz_arbitrary_strings_only_raise_native_auth_error(token: str) -> None:
    v = verifier()
    try:
        v.verify(token)
    except NativeAuthError as exc:
        assert exc.code in (TOKEN_INVALID, TOKEN_EXPIRED)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(GOOD) - 1), st.characters(codec="utf-8"))
def test_fuzz_mutated_valid_token(position: int, char: str) -> None:
    mutated = GOOD[:position] + char + GOOD[position + 1 :]
    v = verifier()
    try:
        identity = v.verify(mutated)
    except NativeAuthError as exc:
        assert exc.code == TOKEN_INVALID
    else:  # the only other spelling of a token: the case of its signature's hex digits
        assert mutated[:-128] == GOOD[:-128] and mutated[-128:].lower() == GOOD_S
        assert identity.address == ADDRESS


# Cache ------------------------------------------------------------------------------------------------
def test_cache_hits_and_lru_bound() -> None:
    blocks = FakeBlocks()
    v = verifier(blocks, cache_size=2)
    t1, t2, t3 = (signed_token(ttl=n) for n in (10, 20, 30))
    v.verify(t1)
    v.verify(t1)
    assert blocks.hash_lookups == 1
    v.verify(t2)
    v.verify(t1)  # t1 most recent, t2 least
    v.verify(t3)  # evicts t2
    assert blocks.hash_lookups == 3
    v.verify(t1)
    v.verify(t3)
    assert blocks.hash_lookups == 3
    v.verify(t2)
    assert blocks.hash_lookups == 4


def test_cached_identity_not_shared() -> None:
    v = verifier()
    token = signed_token(extra_json='{"a": {"b": 1}}')
    first = v.verify(token)
    first.extra_info["a"]["b"] = 2
    assert v.verify(token).extra_info == {"a": {"b": 1}}


def test_failures_not_cached() -> None:
    blocks = FakeBlocks(blocks={})
    v = verifier(blocks)
    token = signed_token()
    assert_rejected(v, token)
    blocks.blocks[BLOCK] = ISSUED_MS
    assert v.verify(token).issued_ms == ISSUED_MS


def test_cache_disabled() -> None:
    blocks = FakeBlocks()
    v = verifier(blocks, cache_size=0)
    v.verify(GOOD)
    v.verify(GOOD)
    assert blocks.hash_lookups == 2


# Cross-checks with the SDK ----------------------------------------------------------------------------
class StubCache:
    """NativeAuthServer's cache interface, preloaded so it never calls the API (timestamps in seconds)."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = values

    def get(self, key: str) -> int | None:
        return self.values.get(key)

    def set(self, key: str, value: int, ttl: int) -> None:
        self.values[key] = value


def sdk_server(latest_s: int, accepted: list[str] | None = None) -> NativeAuthServer:
    cache = StubCache({f"block:timestamp:{BLOCK}": ISSUED_MS // 1000, "block:timestamp:latest": latest_s})
    return NativeAuthServer(NativeAuthServerConfig(accepted_origins=accepted or [ORIGIN]), cache=cache)


def sdk_client_token(key: UserSecretKey, *, ttl: int, extra_info: dict[str, Any] | None = None) -> str:
    """The SDK's own flow: NativeAuthClient (block hash stubbed) + Account.sign_message."""
    client = NativeAuthClient(NativeAuthClientConfig(origin=ORIGIN, expiry_seconds=ttl))
    client.get_current_block_hash = lambda: BLOCK  # type: ignore[method-assign]
    init = client.initialize(extra_info)
    account = Account(key)
    signature = account.sign_message(Message(client.get_token_for_signing(account.address, init)))
    return client.get_token(account.address, init, signature.hex())


def test_sdk_client_token_verifies() -> None:
    token = sdk_client_token(KEY, ttl=120, extra_info={"k": [1, 2]})
    identity = verifier().verify(token)
    assert (identity.address, identity.ttl_seconds, identity.extra_info) == (ADDRESS, 120, {"k": [1, 2]})
    assert token == make_native_auth_token(
        KEY, origin=ORIGIN, block_hash=BLOCK, ttl_seconds=120, extra_info={"k": [1, 2]}
    )


def test_our_token_verifies_with_sdk_server() -> None:
    token = make_native_auth_token(KEY, origin=ORIGIN, block_hash=BLOCK, ttl_seconds=300, extra_info={"n": 1})
    result = sdk_server(latest_s=ISSUED_MS // 1000 + 10).validate(token)
    assert result.address.to_bech32() == ADDRESS
    assert result.origin == ORIGIN
    assert result.extra_info == {"n": 1}
    assert result.expires == result.issued + 300


def test_sdk_server_agrees_on_rejections() -> None:
    server = sdk_server(latest_s=ISSUED_MS // 1000)
    assert server.is_valid(signed_token(suffix="{}"))
    assert not server.is_valid(signed_token(raw=True))
    assert not server.is_valid(signed_token(origin="https://evil.example.org"))
    expired = sdk_server(latest_s=ISSUED_MS // 1000 + 61)
    assert not expired.is_valid(signed_token(ttl=60))
    assert sdk_server(latest_s=ISSUED_MS // 1000 + 60).is_valid(signed_token(ttl=60))
