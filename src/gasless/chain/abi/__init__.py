"""Contract ABIs kept in the repo (billing, exchange pair, EGLD wrapper) and the codec helpers around them.

Every encoding and decoding goes through multiversx-sdk's ABI codec with these files, on the service side
and inside localnet's contract models alike, so the two cannot drift apart. Decoded values are the SDK's
native payloads: `Address` -> 32-byte public key, `BigUint`/`uNN` -> int, `TokenIdentifier` -> str,
`bytes` -> bytes, `array32<u8>` -> list[int], structs -> SimpleNamespace, enums -> a namespace with
`__name__` and `__discriminant__` (see `enum_name`), `Option<T>` -> value or None, `variadic<T>` -> list.
"""

from __future__ import annotations

from copy import deepcopy
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from multiversx_sdk.abi import Abi, MultiValue, OptionalValue, VariadicValues
from multiversx_sdk.abi.counted_variadic_values import CountedVariadicValues
from multiversx_sdk.abi.serializer import Serializer

ABI_DIR = Path(__file__).resolve().parent
BILLING_ABI_PATH = ABI_DIR / "billing.abi.json"
PAIR_ABI_PATH = ABI_DIR / "pair.abi.json"
WRAPPER_ABI_PATH = ABI_DIR / "wrapper.abi.json"

_serializer = Serializer()


class AbiArgumentError(ValueError):
    """Call arguments that do not match the endpoint's inputs; `message` is what the VM would signal."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@cache
def load_abi(path: Path) -> Abi:
    """The ABI at `path`, parsed once. Treat it as read-only: the helpers below copy its prototypes."""
    return Abi.load(path)


def load_billing_abi() -> Abi:
    return load_abi(BILLING_ABI_PATH)


def load_pair_abi() -> Abi:
    return load_abi(PAIR_ABI_PATH)


def load_wrapper_abi() -> Abi:
    return load_abi(WRAPPER_ABI_PATH)


def encode_args(abi: Abi, endpoint: str, values: list[Any]) -> list[bytes]:
    """Call arguments (native values, one per ABI input) -> raw argument parts."""
    return abi.encode_endpoint_input_parameters(endpoint, values)


def decode_args(abi: Abi, endpoint: str, parts: list[bytes]) -> list[Any]:
    """Raw argument parts -> native values, one per ABI input; AbiArgumentError when they do not fit."""
    prototype = abi.endpoints_prototypes_by_name.get(endpoint)
    if prototype is None:
        raise AbiArgumentError("invalid function (not found)")
    values = deepcopy(prototype.input_parameters)
    low, high = _arity(values)
    if len(parts) < low or (high is not None and len(parts) > high):
        raise AbiArgumentError("wrong number of arguments")
    try:
        _serializer.deserialize_parts(parts, values)
    except Exception as exc:  # the SDK raises plain Exception/ValueError for malformed input
        raise AbiArgumentError(f"argument decode error: {exc}") from None
    return [value.get_payload() for value in values]


def encode_outputs(abi: Abi, endpoint: str, values: list[Any]) -> list[bytes]:
    """Native return values, one per ABI output -> return-data parts."""
    prototype = abi.endpoints_prototypes_by_name[endpoint]
    if len(values) != len(prototype.output_parameters):
        raise ValueError(
            f"{endpoint}: expected {len(prototype.output_parameters)} outputs, got {len(values)}"
        )
    outputs = deepcopy(prototype.output_parameters)
    for holder, value in zip(outputs, values, strict=True):
        holder.set_payload(value)
    return _serializer.serialize_to_parts(outputs)


def decode_outputs(abi: Abi, endpoint: str, parts: list[bytes]) -> list[Any]:
    """Return-data parts (e.g. of `vm-values/query`) -> native values, one per ABI output."""
    return abi.decode_endpoint_output_parameters(endpoint, parts)


def encode_event(abi: Abi, name: str, fields: dict[str, Any]) -> tuple[list[bytes], list[bytes]]:
    """An event's fields -> (topics after the identifier topic, data parts), as the VM writes them."""
    definition = abi.definition.get_event_definition(name)
    prototype = abi.events_prototypes_by_name[name]
    expected = {item.name for item in definition.inputs}
    if set(fields) != expected:
        raise ValueError(f"event {name}: fields {sorted(fields)} do not match {sorted(expected)}")
    indexed = {item.name: item.indexed for item in definition.inputs}
    topics: list[bytes] = []
    data: list[bytes] = []
    for field in deepcopy(prototype.fields):
        field.value.set_payload(fields[field.name])
        parts = _serializer.serialize_to_parts([field.value])
        (topics if indexed[field.name] else data).extend(parts)
    return topics, data


def decode_event(abi: Abi, name: str, topics: list[bytes], data: list[bytes]) -> SimpleNamespace:
    """The inverse of `encode_event`: topics exclude the identifier topic."""
    return abi.decode_event(name, topics, data)


def enum_name(value: Any) -> str:
    """The variant name of a decoded enum payload."""
    return str(value.__name__)


def _arity(values: list[Any]) -> tuple[int, int | None]:
    """Least and most argument parts the values take (None: unbounded)."""
    low = 0
    high: int | None = 0
    for value in values:
        if isinstance(value, (VariadicValues, CountedVariadicValues)):
            high = None
            if isinstance(value, CountedVariadicValues):
                low += 1
        elif isinstance(value, OptionalValue):
            if high is not None:
                high += 1
        elif isinstance(value, MultiValue):
            sub_low, sub_high = _arity(list(value.items))
            low += sub_low
            high = None if high is None or sub_high is None else high + sub_high
        else:
            low += 1
            if high is not None:
                high += 1
    return low, high
