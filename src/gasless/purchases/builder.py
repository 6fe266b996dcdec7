"""Unsigned contract calls for the purchase builders: the sender's next nonces, the relayer and its lease,
the call's data through the contract's ABI, and a gas limit measured by the gateway's cost estimate.

Nothing is stored and nothing is signed here: the user signs the transactions and relays them like any other.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from multiversx_sdk import Address, Transaction

from gasless.chain.abi import load_billing_abi
from gasless.chain.addresses import parse_address
from gasless.chain.calls import contract_call
from gasless.chain.codec import tx_to_wire
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.core.errors import ApiError
from gasless.purchases.schemas import ContractCall, PreparedTransaction, UnsignedTransaction
from gasless.relay.assign import AssignService, next_free_nonce
from gasless.relay.leases import LeaseKind
from gasless.relay.repository import IntentRepository
from gasless.relay.schemas import Assignment

# Gas above the gateway's estimate of the processing: room for state that changes before execution, well
# inside what relay accepts (GAS_OVERPROVISIONED past 1.9 times the simulated processing).
PROCESSING_MARGIN = 1.25
OPTION_GUARDED = 2


@dataclass(frozen=True)
class Call:
    """One contract call to build: the function, its ABI arguments, and a USDC payment when one goes with it."""

    function: str
    arguments: list[Any]
    shown_args: list[Any]  # the arguments as the response shows them (JSON-plain)
    payment_amount: int = 0


def unsigned_transaction(tx: Transaction) -> UnsignedTransaction:
    wire = tx_to_wire(tx)
    wire.pop("signature", None)
    return UnsignedTransaction(**wire)


class CallBuilder:
    def __init__(
        self,
        *,
        chain_id: str,
        contract: str,
        payment_token: str,
        gateway: GatewayClient,
        network: NetworkView,
        assign: AssignService,
        repo: IntentRepository,
    ) -> None:
        self.chain_id = chain_id
        self.contract = contract
        self.payment_token = payment_token
        self.gateway = gateway
        self.network = network
        self.assign = assign
        self.repo = repo
        self.abi = load_billing_abi()

    async def next_nonce(self, sender: str) -> int:
        """The sender's next free nonce: past its account nonce, the pool and our own in-flight intents."""
        return await next_free_nonce(
            self.gateway,
            self.repo,
            sender,
            self.assign.now_ms(),
            unavailable="no gateway answered; nothing was built",
        )

    async def guardian_of(self, sender: str) -> str | None:
        try:
            data = await self.gateway.guardian_data(sender)
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="no gateway answered; nothing was built") from exc
        if not data or not data.get("guarded"):
            return None
        return (data.get("activeGuardian") or {}).get("address") or None

    async def require_funds(self, sender: str, amount: int) -> None:
        """The sender holds the payment the calls carry (else the transaction would fail on chain)."""
        if amount <= 0:
            return
        try:
            held = await self.gateway.esdt_balance(sender, self.payment_token)
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="no gateway answered; nothing was built") from exc
        if held < amount:
            raise ApiError(
                "INSUFFICIENT_SENDER_BALANCE",
                detail=f"{sender} holds {held} of {self.payment_token}, the call pays {amount}; fund the "
                "wallet first",
                details={"token": self.payment_token, "requiredMicroUsdc": amount, "heldMicroUsdc": held},
            )

    def assignment(self, sender: str, kind: LeaseKind, nonce: int | None) -> Assignment:
        return self.assign.issue(sender, kind, pin_nonce=nonce)

    async def build(
        self,
        sender: str,
        calls: list[Call],
        *,
        kinds: list[tuple[bool, int | None]],
        fees: list[int] | None = None,
    ) -> tuple[list[PreparedTransaction], Assignment]:
        """One transaction per call at consecutive nonces from the sender's next, one relayer and lease (free
        when the first call is free); `kinds` holds (free, ru) for each call."""
        nonce, guardian = await asyncio.gather(self.next_nonce(sender), self.guardian_of(sender))
        await self.require_funds(sender, sum(call.payment_amount for call in calls))
        free_lease = kinds[0][0]
        # One call: the lease pins its nonce; several: one lease serves the consecutive nonces.
        pin = nonce if len(calls) == 1 else None
        assignment = self.assignment(sender, "free" if free_lease else "std", pin)
        relayer = parse_address(assignment.relayer)
        prepared = []
        for index, call in enumerate(calls):
            tx = await self._transaction(sender, call, nonce + index, relayer, guardian)
            free, ru = kinds[index]
            prepared.append(
                PreparedTransaction(
                    transaction=unsigned_transaction(tx),
                    assignment=assignment,
                    contractCall=self.contract_call(call),
                    free=free,
                    ru=None if free else ru,
                    feeMicroUsdc=(fees or [0] * len(calls))[index],
                )
            )
        return prepared, assignment

    def contract_call(self, call: Call) -> ContractCall:
        return ContractCall(
            contract=self.contract,
            function=call.function,
            args=call.shown_args,
            paymentToken=self.payment_token if call.payment_amount else None,
            paymentAmount=str(call.payment_amount) if call.payment_amount else None,
        )

    async def _transaction(
        self, sender: str, call: Call, nonce: int, relayer: Address, guardian: str | None
    ) -> Transaction:
        params = self.network.params
        tx = contract_call(
            abi=self.abi,
            chain_id=self.chain_id,
            sender=parse_address(sender),
            contract=parse_address(self.contract),
            function=call.function,
            arguments=call.arguments,
            gas_limit=params.max_gas_per_tx,  # measured below
            nonce=nonce,
            relayer=relayer,
            payment_token=self.payment_token if call.payment_amount else None,
            payment_amount=call.payment_amount,
        )
        tx.gas_price = params.min_gas_price
        if guardian is not None:
            tx.options = OPTION_GUARDED
            tx.guardian = parse_address(guardian)
        tx.gas_limit = await self._gas_limit(tx)
        return tx

    async def _gas_limit(self, tx: Transaction) -> int:
        """Movement gas plus the gateway's estimate of the processing, with a margin."""
        rules = self.network.params.gas_rules()
        movement = rules.movement_gas_of(tx)
        wire = tx_to_wire(tx)
        try:
            estimate = await self.gateway.cost(wire)
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError(
                "UPSTREAM_UNAVAILABLE", detail="the gas estimate failed; nothing was built"
            ) from exc
        units = int(estimate.get("txGasUnits") or 0)
        if units <= 0:
            message = str(estimate.get("returnMessage") or "no estimate")
            paused = _pause_refusal(message)
            if paused is not None:  # a pause the chain saw before this host's cached views did
                raise paused
            raise ApiError(
                "UPSTREAM_UNAVAILABLE", detail=f"the gateway could not estimate the call's gas: {message}"
            )
        processing = max(0, units - movement)
        return movement + math.ceil(processing * PROCESSING_MARGIN)


# The contract's pause errors, when the gas estimate meets them: the same answers as the pause checks give.
_PAUSES = {
    "ERR_SWAP_VENUE_PAUSED": ("SWAP_VENUE_PAUSED", None),
    "ERR_PAUSED": ("CONTRACT_PAUSED", "global"),
    "ERR_DEPOSITS_PAUSED": ("CONTRACT_PAUSED", "deposits"),
}


def _pause_refusal(message: str) -> ApiError | None:
    for error, (code, scope) in _PAUSES.items():
        if error in message.split(":")[-1].split():
            details: dict[str, object] = {"retryAfterMs": 30_000}
            if scope is not None:
                details = {"scope": scope, **details}
            return ApiError(
                code, detail=f"the chain refuses the call now ({error}); nothing was built", details=details
            )
    return None
