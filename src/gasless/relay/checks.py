"""The relay checks that need no I/O: request parsing and the static rules on the transaction.

Each check returns an ApiError or None, so `POST /v1/relay` stops at the first failure while
`POST /v1/validate` collects every failure of a stage (later stages depend on earlier ones passing).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from multiversx_sdk import Transaction

from gasless.billing.policy import MAX_DATA_BYTES_SELF_SERVE
from gasless.billing.schedule import RU_SCHEDULE_VERSION
from gasless.chain.addresses import InvalidAddress, parse_address, shard_of_pubkey
from gasless.chain.codec import INT64_MAX, WireError, signing_bytes, tx_from_wire
from gasless.chain.gas import OPTION_GUARDED, OPTION_HASH_SIGN, GasRules, is_guarded
from gasless.chain.network import NetworkParams
from gasless.core.errors import ApiError
from gasless.http.json_text import parse_json

MAX_BODY_BYTES = 131_072
SUPPORTED_VERSION = 2
SUPPORTED_OPTIONS = OPTION_HASH_SIGN | OPTION_GUARDED
RELAY_MEMBERS = frozenset({"tx", "lease", "intentKey", "account"})
VARIANT_MEMBERS = ("variants", "transactions", "alternates")
IDEMPOTENCY_KEY_MIN, IDEMPOTENCY_KEY_MAX = 16, 128

Check = Callable[[], ApiError | None]


def first_failure(checks: Iterable[Check]) -> ApiError | None:
    for check in checks:
        error = check()
        if error is not None:
            return error
    return None


def all_failures(checks: Iterable[Check]) -> list[ApiError]:
    return [error for check in checks if (error := check()) is not None]


@dataclass(frozen=True)
class ParsedRelay:
    body: dict[str, Any]
    tx: Transaction
    wire: dict[str, Any]
    lease_token: Any
    intent_key: str | None
    account: str | None  # the account the sender expects to pay (a sponsor key decides instead)
    signing_bytes: bytes
    bytes_sha256: str
    sender: str
    sender_pubkey: bytes
    sender_shard: int


def parse_json_body(raw: bytes) -> Any:
    """The body's JSON, as every route parses it (a repeated member is MALFORMED_REQUEST, http/json_body)."""
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError("PAYLOAD_TOO_LARGE", detail=f"body is larger than {MAX_BODY_BYTES} bytes")
    return parse_json(raw)


def _valid_key(key: str) -> bool:
    return IDEMPOTENCY_KEY_MIN <= len(key) <= IDEMPOTENCY_KEY_MAX and all(0x21 <= ord(c) <= 0x7E for c in key)


# Transaction members that would change what a relay costs but that RU schedule v1 does not price (it prices
# the gas limit alone): fee and tip fields of other chains' transaction formats, and batched inner
# transactions. Each is refused as UNSUPPORTED_TX_FIELD (not MALFORMED_REQUEST): the request is well formed,
# the schedule has no price for it. docs/relay.md lists them.
UNPRICED_FEE_FIELDS = frozenset(
    {
        "fee",
        "maxFee",
        "maxFeePerGas",
        "maxPriorityFeePerGas",
        "priorityFee",
        "tip",
        "gasTip",
        "gasPriceModifier",
        "feeToken",
        "innerTransactions",
    }
)


# A gas limit or price beyond the wire's integer range (2^53 - 1) is above any network's ceiling; it is refused
# with the protocol's ceilings, the ones every MultiversX network has used (the static checks, which come
# after parsing, report the network's own).
MAX_GAS_LIMIT = GasRules.max_gas_per_tx


def parse_transaction(wire: Any, field_prefix: str = "tx") -> Transaction:
    if isinstance(wire, dict):
        unpriced = sorted(UNPRICED_FEE_FIELDS & set(wire))
        if unpriced:
            field = f"{field_prefix}.{unpriced[0]}"
            raise ApiError(
                "UNSUPPORTED_TX_FIELD",
                detail=f"{field} is fee-relevant and RU schedule {RU_SCHEDULE_VERSION} does not price it; "
                "the schedule prices the gas limit only",
                details={"field": field, "ruScheduleVersion": RU_SCHEDULE_VERSION},
            )
    try:
        return tx_from_wire(wire, allow_unknown=False)
    except WireError as exc:
        if exc.above is not None and exc.field == "gasLimit":
            # An integer, just too large for any transaction: the catalogue's ceiling, not a malformed body.
            raise ApiError(
                "GAS_LIMIT_TOO_HIGH",
                detail=f"gas limit above the ceiling {MAX_GAS_LIMIT}",
                details={"limit": MAX_GAS_LIMIT, "actual": exc.above},
            ) from None
        if exc.above is not None and exc.field == "gasPrice":
            raise ApiError(
                "GAS_PRICE_OUT_OF_RANGE",
                detail="gas price above twice the network minimum",
                details={"limit": 2 * GasRules.min_gas_price, "actual": exc.above, "bound": "max"},
            ) from None
        field = f"{field_prefix}.{exc.field}" if exc.field != "transaction" else field_prefix
        raise ApiError(
            "MALFORMED_REQUEST", detail=f"{field} {exc.message}", details={"field": field}
        ) from None


def parse_relay_body(
    body: Any, header_key: str | None, *, members: frozenset[str] = RELAY_MEMBERS
) -> ParsedRelay:
    """The relay request's members in the interface contract's order of refusal."""
    if not isinstance(body, dict):
        raise ApiError("MALFORMED_REQUEST", detail="body must be a JSON object", details={"field": "body"})
    for name in VARIANT_MEMBERS:
        if name in body:
            raise ApiError(
                "VARIANTS_NOT_SUPPORTED", detail=f"`{name}`: one request relays one signed transaction"
            )
    unknown = sorted(set(body) - members)
    if unknown:
        raise ApiError(
            "MALFORMED_REQUEST", detail=f"unknown member `{unknown[0]}`", details={"field": unknown[0]}
        )
    wire = body.get("tx")
    if not isinstance(wire, dict):
        raise ApiError(
            "MALFORMED_REQUEST", detail="`tx` must be a transaction object", details={"field": "tx"}
        )
    if wire.get("relayerSignature") not in (None, ""):
        raise ApiError(
            "RELAYER_SIGNATURE_PRESENT", detail="the transaction already carries a relayer signature"
        )
    tx = parse_transaction(wire)  # every integer in its range (gasless.http.formats), or MALFORMED_REQUEST
    intent_key = body.get("intentKey")
    if intent_key is not None and (not isinstance(intent_key, str) or not _valid_key(intent_key)):
        raise ApiError(
            "MALFORMED_REQUEST",
            detail="intentKey must be 16 to 128 visible ASCII characters",
            details={"field": "intentKey"},
        )
    if header_key is not None:
        if not _valid_key(header_key):
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="Idempotency-Key must be 16 to 128 visible ASCII characters",
                details={"field": "Idempotency-Key"},
            )
        intent_key = header_key  # the header wins over the body member
    account = body.get("account")
    if account is not None:
        try:
            account = parse_address(account).to_bech32() if isinstance(account, str) else None
        except InvalidAddress:
            account = None
        if account is None:
            raise ApiError(
                "MALFORMED_REQUEST", detail="account must be an erd1 address", details={"field": "account"}
            )
    message = signing_bytes(tx)
    pubkey = tx.sender.get_public_key()
    return ParsedRelay(
        body=body,
        tx=tx,
        wire=wire,
        lease_token=body.get("lease"),
        intent_key=intent_key,
        account=account,
        signing_bytes=message,
        bytes_sha256=hashlib.sha256(message).hexdigest(),
        sender=tx.sender.to_bech32(),
        sender_pubkey=pubkey,
        sender_shard=shard_of_pubkey(pubkey),
    )


def gas_limit_problem(tx: Transaction, params: NetworkParams) -> ApiError | None:
    """At least the movement gas, at most the network's ceiling (relay and quote apply the same rule)."""
    movement = params.gas_rules().movement_gas(data_len=len(tx.data), guarded=is_guarded(tx), relayed=True)
    if tx.gas_limit < movement:
        return ApiError(
            "GAS_LIMIT_TOO_LOW",
            detail=f"gas limit below the movement gas {movement}",
            details={"limit": movement, "actual": tx.gas_limit},
        )
    if tx.gas_limit > params.max_gas_per_tx:
        return ApiError(
            "GAS_LIMIT_TOO_HIGH",
            detail=f"gas limit above the ceiling {params.max_gas_per_tx}",
            details={"limit": params.max_gas_per_tx, "actual": tx.gas_limit},
        )
    return None


def static_checks(
    tx: Transaction,
    params: NetworkParams,
    *,
    relayer_shard: Callable[[str], int | None],
    data_limit: int = MAX_DATA_BYTES_SELF_SERVE,
    lease_present: bool = True,
) -> list[Check]:
    """The rules on the transaction alone, in the order relay applies them."""
    relayer = tx.relayer.to_bech32() if tx.relayer is not None and not tx.relayer.is_empty() else None
    sender_shard = shard_of_pubkey(tx.sender.get_public_key(), params.num_shards)

    def chain_id() -> ApiError | None:
        if tx.chain_id != params.chain_id:
            return ApiError(
                "CHAIN_ID_MISMATCH",
                detail=f"signed for chain {tx.chain_id!r}; this host serves {params.chain_id!r}",
            )
        return None

    def version() -> ApiError | None:
        if tx.version != SUPPORTED_VERSION:
            return ApiError(
                "TX_VERSION_UNSUPPORTED", detail=f"version {tx.version} is not relayed; use version 2"
            )
        return None

    def options() -> ApiError | None:
        if tx.options & ~SUPPORTED_OPTIONS:
            return ApiError(
                "TX_OPTIONS_UNSUPPORTED",
                detail=f"options {tx.options} has unsupported bits (hash-signing and guarded are fine)",
            )
        return None

    def lease() -> ApiError | None:
        return (
            None
            if lease_present
            else ApiError("LEASE_MISSING", detail="no lease: call POST /v1/relay/assign first")
        )

    def relayer_known() -> ApiError | None:
        if relayer is None:
            return ApiError(
                "MALFORMED_REQUEST",
                detail="tx.relayer is required (Relayed-V3)",
                details={"field": "tx.relayer"},
            )
        shard = relayer_shard(relayer)
        if shard is None:
            return ApiError("RELAYER_UNKNOWN", detail=f"{relayer} is not one of this service's relayers")
        if shard != sender_shard:
            return ApiError(
                "RELAYER_SHARD_MISMATCH",
                detail=f"relayer is in shard {shard}, the sender in shard {sender_shard}",
            )
        return None

    def gas_price() -> ApiError | None:
        low, high = params.min_gas_price, 2 * params.min_gas_price
        if tx.gas_price < low:
            return ApiError(
                "GAS_PRICE_OUT_OF_RANGE",
                detail=f"gas price below the network minimum {low}",
                details={"limit": low, "actual": tx.gas_price, "bound": "min"},
            )
        if tx.gas_price > high:
            return ApiError(
                "GAS_PRICE_OUT_OF_RANGE",
                detail=f"gas price above twice the network minimum ({high})",
                details={"limit": high, "actual": tx.gas_price, "bound": "max"},
            )
        return None

    def gas_limit() -> ApiError | None:
        return gas_limit_problem(tx, params)

    def data_size() -> ApiError | None:
        if len(tx.data) > data_limit:
            return ApiError(
                "DATA_TOO_LARGE",
                detail=f"data is {len(tx.data)} bytes; at most {data_limit} on a self-serve account",
                details={"limit": data_limit, "actual": len(tx.data)},
            )
        return None

    def guardian_not_relayer() -> ApiError | None:
        if tx.guardian is not None and not tx.guardian.is_empty() and relayer == tx.guardian.to_bech32():
            return ApiError("GUARDIAN_IS_RELAYER", detail="the guardian and the relayer are the same address")
        return None

    def guardian_form() -> ApiError | None:
        # The node refuses a guardian (or its signature) on a transaction without the guarded option, and
        # a guarded one without them; refusing here keeps such a transaction from ever being co-signed.
        named = tx.guardian is not None and not tx.guardian.is_empty()
        if not is_guarded(tx) and (named or tx.guardian_signature):
            return ApiError(
                "GUARDIAN_MISMATCH",
                detail="the transaction names a guardian but does not set the guarded option",
            )
        if is_guarded(tx) and not named:
            return ApiError(
                "GUARDIAN_MISMATCH", detail="a guarded transaction must name the sender's guardian"
            )
        return None

    def signature_present() -> ApiError | None:
        if len(tx.signature) != 64:
            return ApiError("SENDER_SIGNATURE_INVALID", detail="the transaction carries no sender signature")
        return None

    return [
        chain_id,
        version,
        options,
        lease,
        relayer_known,
        gas_price,
        gas_limit,
        data_size,
        guardian_not_relayer,
        guardian_form,
        signature_present,
    ]


def presence_message(chain_id: str, sender: str, server_time_ms: int) -> bytes:
    return f"relay/assign/v1|{chain_id}|{sender}|{server_time_ms}".encode()


def identify(body: Any) -> tuple[str, int] | None:
    """(sender, nonce) of a refused body when its transaction names them well enough to record REJECTED."""
    from gasless.chain.addresses import InvalidAddress, parse_address

    wire = body.get("tx") if isinstance(body, dict) else None
    if not isinstance(wire, dict):
        return None
    sender, nonce = wire.get("sender"), wire.get("nonce", 0)
    if not isinstance(sender, str) or isinstance(nonce, bool) or not isinstance(nonce, int):
        return None
    if not 0 <= nonce <= INT64_MAX:
        return None
    try:
        return parse_address(sender).to_bech32(), nonce
    except InvalidAddress:
        return None


@dataclass
class ChainState:
    nonce: int
    balance: int
    guarded: bool
    active_guardian: str | None
    pool: list[dict[str, Any]]
    # The account as read and the shard block its state is from: kept after a commit point, so the
    # sender's next relay in the same block reads only the pool (RelayService._account).
    account: dict[str, Any] | None = None
    account_block: int | None = None

    @property
    def pool_last_nonce(self) -> int | None:
        return max((int(entry["nonce"]) for entry in self.pool), default=None)

    def pooled_at(self, nonce: int) -> dict[str, Any] | None:
        entries = [entry for entry in self.pool if int(entry["nonce"]) == nonce]
        return max(entries, key=lambda e: int(e.get("gasprice") or e.get("gasPrice") or 0), default=None)


def gas_price_of(entry: dict[str, Any]) -> int:
    return int(entry.get("gasprice") or entry.get("gasPrice") or 0)


def contract_in_other_shard(receiver_pk: bytes, sender_shard: int) -> bool:
    # Contract addresses carry their shard in the last byte like any other address.
    return receiver_pk[:8] == b"\0" * 8 and shard_of_pubkey(receiver_pk) != sender_shard


def first_or_raise(checks: list[Callable[[], Any]]) -> Any:
    """Run checks in order; raise the first ApiError; the last callable's value is the stage's result."""
    *rules, finish = checks if len(checks) > 1 else (*checks, lambda: None)
    for rule in rules:
        error = rule()
        if error is not None:
            raise error
    return finish()
