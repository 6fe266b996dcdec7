"""Client-side helpers for callers of the service."""

from gasless.client.api import RelayClient, RelayResult, gateway_nonce
from gasless.client.build import (
    MIN_GAS_PRICE,
    BuildContext,
    Call,
    Transfer,
    TxBuilder,
    build_call,
    build_transfer,
    movement_gas,
    tx_wire,
)
from gasless.client.flow import ResignLimitReached, SendResult
from gasless.client.follow import is_final
from gasless.client.keys import TxSigner, UserKey, presence_proof
from gasless.client.problems import RelayProblem
from gasless.client.sse import SSEEvent, SSEParser

__all__ = [
    "MIN_GAS_PRICE",
    "BuildContext",
    "Call",
    "RelayClient",
    "RelayProblem",
    "RelayResult",
    "ResignLimitReached",
    "SSEEvent",
    "SSEParser",
    "SendResult",
    "Transfer",
    "TxBuilder",
    "TxSigner",
    "UserKey",
    "build_call",
    "build_transfer",
    "gateway_nonce",
    "is_final",
    "movement_gas",
    "presence_proof",
    "tx_wire",
]
