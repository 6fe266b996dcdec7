"""Transactions on the wire (the gateway's JSON) <-> multiversx-sdk `Transaction`, hashes and signing bytes.

The SDK constructor silently replaces falsy values (`gasPrice: 0` becomes 1e9, `version: 0` becomes 2), so
the wire form is validated strictly here and the raw values are restored after construction: what the
user signed is what is checked.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from multiversx_sdk import Address, Transaction, TransactionComputer, UserPublicKey

from gasless.chain.addresses import InvalidAddress, parse_address

_computer = TransactionComputer()
_HEX = re.compile("[0-9a-fA-F]*")

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1  # the network's type for gas limit and gas price
SAFE_INT_MAX = 2**53 - 1
UINT32_MAX = 2**32 - 1
AMOUNT_DIGITS = 78  # uint256 in decimal
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_BASE64 = re.compile(BASE64_PATTERN.removeprefix("^").removesuffix("$"))

# The ranges of the wire members (documented by gasless.http.formats; docs/api-conventions.md "Input formats"): a nonce is an
# int64, gas limit and gas price stay below 2^53, version and options are uint32, `value` has at most 78
# digits. The network's own types are wider (uint64, big integers); nothing in range is lost, and nothing out
# of range reaches the SDK's encoders (which overflow) or the database (int64 columns).
U32_MAX = UINT32_MAX

# Wire members as the gateway's `POST /transaction/send` accepts them.
WIRE_FIELDS = frozenset(
    {
        "nonce",
        "value",
        "receiver",
        "sender",
        "senderUsername",
        "receiverUsername",
        "gasPrice",
        "gasLimit",
        "data",
        "signature",
        "chainID",
        "version",
        "options",
        "guardian",
        "guardianSignature",
        "relayer",
        "relayerSignature",
    }
)


class WireError(ValueError):
    """A wire transaction member is missing or malformed."""

    def __init__(self, field: str, message: str, *, above: int | None = None) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.above = above  # an integer above the member's range: the value (a catalogue ceiling may apply)


def _uint(d: dict[str, Any], name: str, *, required: bool, maximum: int) -> int:
    value = d.get(name)
    if value is None:
        if required:
            raise WireError(name, "is required")
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's integer: a number with a zero fraction (`2.0` is 2)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(name, "must be an integer")
    if value < 0 or value > maximum:
        # Above the range but within the network's own type (uint64): an integer that is too large, which a
        # caller may answer with a catalogue ceiling rather than as malformed.
        above = value if maximum < value <= UINT64_MAX else None
        raise WireError(name, f"must be between 0 and {maximum}", above=above)
    return value


def _decimal(d: dict[str, Any], name: str) -> int:
    value = d.get(name, "0")
    if value in (None, ""):
        return 0
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        raise WireError(name, "must be a non-negative decimal string")
    if len(value) > 1 and value[0] == "0":
        raise WireError(name, "must not have leading zeros")
    if len(value) > AMOUNT_DIGITS:  # before int(): no huge conversions, no integers the encoders refuse
        raise WireError(name, f"must have at most {AMOUNT_DIGITS} digits")
    return int(value)


def _address(d: dict[str, Any], name: str, *, required: bool) -> Address | None:
    value = d.get(name)
    if value in (None, ""):
        if required:
            raise WireError(name, "is required")
        return None
    if not isinstance(value, str):
        raise WireError(name, "must be a bech32 address")
    try:
        return parse_address(value)
    except InvalidAddress:
        raise WireError(name, "is not a valid erd1 bech32 address") from None


def _hex(d: dict[str, Any], name: str, *, length: int | None = 64) -> bytes:
    value = d.get(name)
    if value in (None, ""):
        return b""
    if not isinstance(value, str) or not _HEX.fullmatch(value) or len(value) % 2:
        raise WireError(name, "must be a hex string")  # fromhex() alone would also skip spaces
    raw = bytes.fromhex(value)
    if length is not None and len(raw) != length:
        raise WireError(name, f"must be {length} bytes ({length * 2} hex characters)")
    return raw


def _b64(d: dict[str, Any], name: str) -> bytes:
    value = d.get(name)
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise WireError(name, "must be a base64 string")
    if not _BASE64.fullmatch(value):  # exactly what the documented pattern says: padded, standard alphabet
        raise WireError(name, "must be standard base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(name, "must be standard base64") from None


def tx_from_wire(d: Any, *, allow_unknown: bool = True) -> Transaction:
    """A Transaction from the gateway's JSON form; WireError names the first bad member."""
    if not isinstance(d, dict):
        raise WireError("transaction", "must be a JSON object")
    if not allow_unknown:
        unknown = sorted(set(d) - WIRE_FIELDS)
        if unknown:
            raise WireError(unknown[0], "is not a transaction member")
    chain_id = d.get("chainID")
    if not isinstance(chain_id, str) or not chain_id:
        raise WireError("chainID", "is required")
    sender = _address(d, "sender", required=True)
    receiver = _address(d, "receiver", required=True)
    assert sender is not None and receiver is not None
    nonce = _uint(d, "nonce", required=False, maximum=INT64_MAX)
    gas_price = _uint(d, "gasPrice", required=True, maximum=SAFE_INT_MAX)
    gas_limit = _uint(d, "gasLimit", required=True, maximum=SAFE_INT_MAX)
    version = _uint(d, "version", required=True, maximum=U32_MAX)
    options = _uint(d, "options", required=False, maximum=U32_MAX)
    for name in ("senderUsername", "receiverUsername"):
        if d.get(name) not in (None, ""):
            _b64(d, name)
    tx = Transaction(
        sender=sender,
        receiver=receiver,
        gas_limit=gas_limit,
        chain_id=chain_id,
        nonce=nonce,
        value=_decimal(d, "value"),
        sender_username=_b64(d, "senderUsername").decode("utf-8", "replace"),
        receiver_username=_b64(d, "receiverUsername").decode("utf-8", "replace"),
        gas_price=gas_price,
        data=_b64(d, "data"),
        version=version,
        options=options,
        guardian=_address(d, "guardian", required=False),
        signature=_hex(d, "signature"),
        guardian_signature=_hex(d, "guardianSignature"),
        relayer=_address(d, "relayer", required=False),
        relayer_signature=_hex(d, "relayerSignature"),
    )
    # Undo the SDK's defaulting of falsy values: keep exactly what was sent.
    tx.gas_price = gas_price
    tx.version = version
    tx.options = options
    tx.nonce = nonce
    tx.gas_limit = gas_limit
    return tx


def tx_to_wire(tx: Transaction) -> dict[str, Any]:
    """The gateway JSON form, without empty optional members."""
    full = tx.to_dictionary()
    return {k: v for k, v in full.items() if v not in ("", None) or k in ("value",)}


def signing_bytes(tx: Transaction) -> bytes:
    """The bytes sender, relayer and guardian sign (keccak of the JSON when hash-signing)."""
    return _computer.compute_bytes_for_verifying(tx)


def tx_hash(tx: Transaction) -> str:
    """blake2b-256 over the protobuf form, signatures included: the node's transaction hash."""
    return _computer.compute_transaction_hash(tx).hex()


def verify_ed25519(pubkey: bytes, message: bytes, signature: bytes) -> bool:
    """A raw Ed25519 check through the SDK's key type; malformed keys or signatures are simply invalid."""
    if len(signature) != 64 or len(pubkey) != 32:
        return False
    try:
        return bool(UserPublicKey(pubkey).verify(message, signature))
    except Exception:  # PyNaCl raises on points that are not on the curve
        return False
