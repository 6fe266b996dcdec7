"""A contract model driven by its ABI file: dispatch, payability, owner checks, argument and event codecs.

A subclass implements one method per ABI endpoint: `_ep_<snake_name>(ctx, *args)` for a mutable endpoint
and `_view_<snake_name>(now_ms, *args)` for a readonly one. Both return the native output values (one per
ABI output, or None when there are none); the base encodes them with the ABI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from multiversx_sdk.abi.abi_definition import EndpointDefinition

from gasless.chain.abi import AbiArgumentError, decode_args, encode_event, encode_outputs, load_abi
from gasless.localnet.vm import EGLD, CallContext, ContractError

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")

ERR_NOT_OWNER = "ERR_NOT_OWNER"
ERR_FUNCTION_NOT_FOUND = "invalid function (not found)"


def handler_name(endpoint: EndpointDefinition) -> str:
    prefix = "_view_" if endpoint.mutability == "readonly" else "_ep_"
    return prefix + _CAMEL.sub("_", endpoint.name).lower()


def to_bytes32(value: Any, what: str) -> bytes:
    """A decoded `array32<u8>` as bytes; the SDK does not check the length of a top-level array."""
    raw = bytes(value)
    if len(raw) != 32:
        raise ContractError(f"argument decode error ({what}): expected 32 bytes")
    return raw


class AbiContract:
    """Base of localnet's contract models.

    A model is saved with the chain (`gasless.localnet.persist`) as its class and its fields; the ABI is not
    saved: it is the class's `abi_file`, loaded again.
    """

    name: str
    abi_file: ClassVar[Path]
    gas_table: Mapping[str, int] = {}
    default_gas: int = 3_000_000

    def __init__(self) -> None:
        self._bind_abi()

    def _bind_abi(self) -> None:
        self.abi = load_abi(self.abi_file)
        self._endpoints = {e.name: e for e in self.abi.definition.endpoints}
        missing = [e.name for e in self._endpoints.values() if not hasattr(self, handler_name(e))]
        if missing:
            raise TypeError(f"{type(self).__name__} lacks handlers for ABI endpoints {missing}")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("abi", "_endpoints")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._bind_abi()

    @property
    def owner(self) -> bytes:
        raise NotImplementedError

    # Contract protocol ------------------------------------------------------------------------------
    def gas_cost(self, function: str) -> int:
        return self.gas_table.get(function, self.default_gas)

    def call(self, ctx: CallContext) -> list[bytes]:
        endpoint = self._endpoints.get(ctx.function)
        if endpoint is None:
            raise ContractError(ERR_FUNCTION_NOT_FOUND)
        self._check_payment(endpoint, ctx)
        if endpoint.only_owner and ctx.caller != self.owner:
            raise ContractError(ERR_NOT_OWNER)
        args = self._decode(endpoint.name, ctx.args)
        handler = getattr(self, handler_name(endpoint))
        if endpoint.mutability == "readonly":
            result = handler(ctx.block_timestamp_ms, *args)
        else:
            result = handler(ctx, *args)
        return encode_outputs(self.abi, endpoint.name, list(result or []))

    def query(self, function: str, args: list[bytes], caller: bytes | None, now_ms: int) -> list[bytes]:
        endpoint = self._endpoints.get(function)
        if endpoint is None or endpoint.mutability != "readonly":
            raise ContractError(ERR_FUNCTION_NOT_FOUND)
        result = getattr(self, handler_name(endpoint))(now_ms, *self._decode(function, args))
        return encode_outputs(self.abi, function, list(result or []))

    # Helpers for subclasses -------------------------------------------------------------------------
    def emit(self, ctx: CallContext, event: str, **fields: Any) -> None:
        """Emit an ABI event; indexed fields become topics, the others data parts."""
        topics, data = encode_event(self.abi, event, fields)
        ctx.emit(event, topics, data)

    def _decode(self, function: str, args: list[bytes]) -> list[Any]:
        try:
            return decode_args(self.abi, function, args)
        except AbiArgumentError as exc:
            raise ContractError(exc.message) from None

    @staticmethod
    def _check_payment(endpoint: EndpointDefinition, ctx: CallContext) -> None:
        accepted = endpoint.payable_in_tokens
        if not ctx.payments or "*" in accepted:
            return
        if not accepted:
            ctx.require_no_payment()
        for payment in ctx.payments:
            if payment.token not in accepted:
                kind = "EGLD" if payment.token == EGLD else "ESDT"
                raise ContractError(f"function does not accept {kind} payment")
