"""The wire formats every route shares: integer ranges, string patterns, and the OpenAPI components that
name them (`Address`, `TxHash`, `IntentId`).

One place for each rule, read by the code that checks it and by the document that publishes it, so the two
cannot drift: the transaction codec (`chain/codec.py`) bounds its integers with these limits, routes declare
their parameters with these patterns (FastAPI refuses a mismatch with `400 MALFORMED_REQUEST` and
`details.field`), and `openapi.py` adds the components below.

Ranges (docs/api-conventions.md, "Input formats"):

- a nonce is an int64 (0 to 2^63 - 1), as the spec's Intent says;
- gas limits, gas prices, timestamps and other operational integers stay below 2^53 (the spec's data
  conventions: JSON integers all below 2^53, exact in every JSON parser);
- `version` and `options` are uint32, as on the network;
- a native-coin amount (`value`) is a decimal string of at most 78 digits (every uint256, and what the
  ledger's NUMERIC(78,0) holds), without leading zeros.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import StringConstraints, WithJsonSchema

INT64_MAX = 2**63 - 1
SAFE_INT_MAX = 2**53 - 1
UINT32_MAX = 2**32 - 1
AMOUNT_DIGITS = 78

BECH32_CHARS = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
HRP = "erd"
SCHEMAS = "#/components/schemas/"


def decimal_range(maximum: int) -> str:
    """A regular expression (no anchors) matching exactly the decimal integers 0..maximum, written without
    leading zeros: what `int()` of an accepted string can give, and nothing it would refuse."""
    if maximum < 0:
        raise ValueError("maximum must be >= 0")
    digits = str(maximum)
    n = len(digits)
    alternatives = []
    if n > 1:
        alternatives.append("[0-9]")  # every shorter number: one digit ...
        if n > 2:
            alternatives.append(f"[1-9][0-9]{{1,{n - 2}}}")  # ... or 2 to n-1 digits
    # n digits, at most `maximum`: a prefix of it, then a smaller digit, then any digits.
    for i, digit in enumerate(digits):
        low = 1 if i == 0 and n > 1 else 0
        high = int(digit) - 1
        if high < low:
            continue
        smaller = str(low) if low == high else f"[{low}-{high}]"
        tail = n - i - 1
        alternatives.append(digits[:i] + smaller + (f"[0-9]{{{tail}}}" if tail else ""))
    alternatives.append(digits)
    return "(?:" + "|".join(alternatives) + ")"


def comma_list(names: Iterable[str]) -> str:
    """A pattern for a comma-separated list of `names` (at least one, no spaces, no empty items)."""
    one = "(?:" + "|".join(re.escape(name) for name in names) + ")"
    return f"^{one}(?:,{one})*$"


NONCE = decimal_range(INT64_MAX)
ADDRESS_PATTERN = f"^{HRP}1[{BECH32_CHARS}]{{58}}$"
TX_HASH_PATTERN = "^[0-9a-fA-F]{64}$"
INTENT_ID_PATTERN = f"^{HRP}1[{BECH32_CHARS}]{{58}}:{NONCE}$"
INTENT_OR_HASH_PATTERN = f"^(?:{HRP}1[{BECH32_CHARS}]{{58}}:{NONCE}|[0-9a-fA-F]{{64}})$"
AMOUNT_PATTERN = f"^(?:0|[1-9][0-9]{{0,{AMOUNT_DIGITS - 1}}})$"
SIGNATURE_PATTERN = "^[0-9a-fA-F]{128}$"
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
VISIBLE_ASCII_KEY_PATTERN = "^[!-~]{16,128}$"  # idempotency keys: 16 to 128 visible ASCII characters

# OpenAPI components (added by openapi.build_document) --------------------------------------------------------
# `format` names the checks a pattern cannot express (the bech32 checksum); clients and test generators
# that know the format can produce valid values, others read the pattern.
COMPONENTS: dict[str, dict[str, Any]] = {
    "Address": {
        "title": "Address",
        "description": "A bech32 address of the network: `erd1` and 58 characters of the bech32 alphabet "
        "(32-byte public key and checksum), lower case. A string of this shape whose checksum does not "
        "verify is refused like any other malformed address (400 MALFORMED_REQUEST).",
        "type": "string",
        "format": "erd-address",
        "pattern": ADDRESS_PATTERN,
        "minLength": 62,
        "maxLength": 62,
    },
    "TxHash": {
        "title": "TxHash",
        "description": "A transaction hash: 64 hexadecimal characters (either case; answers use lower case).",
        "type": "string",
        "pattern": TX_HASH_PATTERN,
        "minLength": 64,
        "maxLength": 64,
    },
    "IntentId": {
        "title": "IntentId",
        "description": "`<sender>:<nonce>`: an Address, a colon and the nonce (an int64, 0 to "
        "9223372036854775807, in decimal without leading zeros).",
        "type": "string",
        "format": "intent-id",
        "pattern": INTENT_ID_PATTERN,
        "minLength": 64,
        "maxLength": 82,
    },
}


def ref(name: str) -> dict[str, str]:
    assert name in COMPONENTS, name
    return {"$ref": SCHEMAS + name}


# Pydantic types: validated as the pattern says, documented as a reference to the component. Response models
# use the `*Doc` forms (documented, not re-validated: the service wrote the value).
Address = Annotated[str, StringConstraints(pattern=ADDRESS_PATTERN), WithJsonSchema(ref("Address"))]
TxHash = Annotated[str, StringConstraints(pattern=TX_HASH_PATTERN), WithJsonSchema(ref("TxHash"))]
IntentId = Annotated[str, StringConstraints(pattern=INTENT_ID_PATTERN), WithJsonSchema(ref("IntentId"))]
AddressDoc = Annotated[str, WithJsonSchema(ref("Address"))]
TxHashDoc = Annotated[str, WithJsonSchema(ref("TxHash"))]
IntentIdDoc = Annotated[str, WithJsonSchema(ref("IntentId"))]
