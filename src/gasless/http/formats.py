"""The wire formats every route shares: integer ranges, string patterns, and the OpenAPI components that
name them (`Address`, `TxHash`, `IntentId`).

One place for each rule, read by the code that checks it and by the document that publishes it, so the two
cannot drift: the transaction codec (`chain/codec.py`) bounds its integers with these limits, routes declare
their parameters with these patterns (FastAPI refuses a mismatch with `400 MALFORMED_REQUEST` and
`details.field`), and `openapi.py` adds the components below.

Ranges (docs/api-conventions.md, "Input formats"):

- a nonce is an int64 (0 to 2^63 - 1), as the interface contract's Intent says;
- gas limits, gas prices, timestamps and other operational integers stay below 2^53 (the interface contract's data
  conventions: JSON integers all below 2^53, exact in every JSON parser);
- `version` and `options` are uint32, as on the network;
- a native-coin amount (`value`) is a decimal string of at most 78 digits (every uint256, and what the
  ledger's NUMERIC(78,0) holds), without leading zeros.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

from gasless.chain.addresses import InvalidAddress, parse_address

# The wire ranges are the codec's (it judges them); re-exported for the routes' schemas.
from gasless.chain.codec import AMOUNT_DIGITS, BASE64_PATTERN, INT64_MAX, SAFE_INT_MAX, UINT32_MAX  # noqa: F401
from gasless.core.errors import ApiError

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
        alternatives.append(
            digits[:i] + smaller + ("[0-9]" if tail == 1 else f"[0-9]{{{tail}}}" if tail else "")
        )
    alternatives.append(digits)
    return "(?:" + "|".join(alternatives) + ")"


def comma_list(item: str) -> str:
    """A pattern for a comma-separated list of `item` (a regular expression): at least one item, no spaces,
    no empty items."""
    return f"^(?:{item})(?:,(?:{item}))*$"


def one_of(names: Iterable[str]) -> str:
    return "|".join(re.escape(name) for name in names)


class CommaList:
    """A comma-separated query parameter of known names (`status=success,dead`): the pattern the document
    publishes and the parser that accepts exactly what it matches. Refusals name the unknown items."""

    def __init__(self, field: str, names: Iterable[str]) -> None:
        self.field = field
        self.names = tuple(names)
        self.pattern = comma_list(one_of(self.names))
        self._matches = re.compile(self.pattern.removeprefix("^").removesuffix("$")).fullmatch

    def parse(self, value: str | None) -> tuple[str, ...] | None:
        """The distinct names in order of first mention; None when the parameter is absent."""
        if value is None:
            return None
        if not self._matches(value):
            unknown = [part for part in value.split(",") if part not in self.names]
            raise ApiError(
                "MALFORMED_REQUEST",
                detail=f"{self.field} is a comma-separated list of {', '.join(self.names)} (no spaces)"
                + (f"; unknown: {', '.join(repr(u) for u in unknown)}" if unknown else ""),
                details={"field": self.field},
            )
        return tuple(dict.fromkeys(value.split(",")))

    def schema(self) -> dict[str, Any]:
        """For `Query(json_schema_extra=...)`: documented here, judged by `parse` (its refusal names the
        unknown items, which a bare pattern failure could not)."""
        return {"pattern": self.pattern}


NONCE = decimal_range(INT64_MAX)
ADDRESS_PATTERN = f"^{HRP}1[{BECH32_CHARS}]{{58}}$"
TX_HASH_PATTERN = "^[0-9a-fA-F]{64}$"
INTENT_ID_PATTERN = f"^{HRP}1[{BECH32_CHARS}]{{58}}:{NONCE}$"
INTENT_OR_HASH_PATTERN = f"^(?:{HRP}1[{BECH32_CHARS}]{{58}}:{NONCE}|[0-9a-fA-F]{{64}})$"
SHARD = decimal_range(UINT32_MAX)  # a shard number; the metachain is 4294967295
# `value` on the wire: no leading zeros, at most 78 digits; empty (as absent) is 0.
AMOUNT_PATTERN = f"^(?:0|[1-9][0-9]{{0,{AMOUNT_DIGITS - 1}}})?$"
SIGNATURE_PATTERN = "^[0-9a-fA-F]{128}$"
# Money, RU, gas and atto in pricing documents and quotes: a non-negative integer in decimal, no leading zeros.
DECIMAL_PATTERN = f"^(?:0|[1-9][0-9]{{0,{AMOUNT_DIGITS - 1}}})$"
VISIBLE_ASCII_KEY_PATTERN = "^[!-~]{16,128}$"  # idempotency keys: 16 to 128 visible ASCII characters

# OpenAPI components (added by openapi.build_document) --------------------------------------------------------
# `format` names the checks a pattern cannot express (the bech32 checksum); clients and test generators
# that know the format can produce valid values, others read the pattern.
COMPONENTS: dict[str, dict[str, Any]] = {
    "Address": {
        "title": "Address",
        "description": "A bech32 address of the network: `erd1` and 58 characters of the bech32 alphabet "
        "(32-byte public key and checksum), lower case. The bech32 checksum is verified, which no pattern "
        "expresses: a string of this shape whose checksum does not verify is refused like any other "
        "malformed address (400 MALFORMED_REQUEST).",
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
    """A reference to a component, for schemas written by hand."""
    assert name in COMPONENTS, name
    return {"$ref": SCHEMAS + name}


# Pydantic cannot emit a `$ref` to a schema it does not generate itself (it looks the target up among its own
# definitions), so its types carry this marker, which `openapi.build_document` turns into the `$ref`.
REF_MARKER = "x-gasless-component"


def component_ref(name: str) -> dict[str, str]:
    """For `WithJsonSchema(...)` on a pydantic type: documented as a `$ref` to the component `name` (one of
    COMPONENTS, or one given to `install_openapi(extra_schemas=...)`)."""
    return {REF_MARKER: name}


def exact_integer_bounds(node: Any) -> Any:
    """`node` with the bounds of integer schemas as integers. FastAPI's document model types `minimum` and
    `maximum` as floats, so a model's `le=100` is published as `100.0` and an int64 bound as
    `9.223372036854776e+18`, which is 2^63, one past the largest int64."""
    if isinstance(node, list):
        return [exact_integer_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    fixed = {key: exact_integer_bounds(value) for key, value in node.items()}
    if fixed.get("type") == "integer":
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            value = fixed.get(key)
            if isinstance(value, float) and value.is_integer() and abs(value) <= SAFE_INT_MAX:
                fixed[key] = int(value)
            elif isinstance(value, float) and value == float(INT64_MAX):  # the only bound above 2^53 in use
                fixed[key] = INT64_MAX
    return fixed


def resolve_markers(node: Any) -> Any:
    """`node` with every marked schema replaced by a `$ref` to its component (its description kept)."""
    if isinstance(node, list):
        return [resolve_markers(item) for item in node]
    if not isinstance(node, dict):
        return node
    if REF_MARKER in node:
        kept = {key: value for key, value in node.items() if key in ("description", "default", "examples")}
        return {"$ref": SCHEMAS + node[REF_MARKER], **kept}
    return {key: resolve_markers(value) for key, value in node.items()}


# Pydantic types: validated as the pattern says, documented as a reference to the component. The `*Doc` forms
# are documented only: response members (the service wrote the value) and parameters the service judges
# itself in an order the interface contract sets (`{erd}` of a credentialed route is read after the credential).
Address = Annotated[str, StringConstraints(pattern=ADDRESS_PATTERN), WithJsonSchema(component_ref("Address"))]
TxHash = Annotated[str, StringConstraints(pattern=TX_HASH_PATTERN), WithJsonSchema(component_ref("TxHash"))]
IntentIdOrTxHash = Annotated[
    str,
    StringConstraints(pattern=INTENT_OR_HASH_PATTERN),
    WithJsonSchema({"anyOf": [component_ref("IntentId"), component_ref("TxHash")]}),
]
AddressDoc = Annotated[str, WithJsonSchema(component_ref("Address"))]


def _checked_address(value: str) -> str:
    try:
        return parse_address(value).to_bech32()
    except InvalidAddress:
        raise ValueError("not a bech32 erd1 address (its checksum does not verify)") from None


# A request member: the documented shape, then its bech32 checksum (MALFORMED_REQUEST naming the member).
CheckedAddress = Annotated[Address, AfterValidator(_checked_address)]
TxHashDoc = Annotated[str, WithJsonSchema(component_ref("TxHash"))]
IntentIdDoc = Annotated[str, WithJsonSchema(component_ref("IntentId"))]

Int64 = Annotated[int, Field(ge=0, le=INT64_MAX)]  # a nonce
SafeInt = Annotated[int, Field(ge=0, le=SAFE_INT_MAX)]  # times and other operational integers
