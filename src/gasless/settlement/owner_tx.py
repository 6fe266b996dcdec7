"""Owner-signed billing-contract calls sent through the service's gateway path (settlement, `gasless admin`).
The owner key is an `OwnerSigner` (gasless.signer.owner): a PEM file or a key in the PKCS#11 token."""

from __future__ import annotations

import asyncio
from typing import Any

from gasless.chain.abi import load_billing_abi
from gasless.chain.addresses import parse_address
from gasless.chain.calls import contract_call
from gasless.chain.codec import signing_bytes
from gasless.chain.gateway import GatewayClient
from gasless.chain.outcomes import contract_failure, process_reason
from gasless.signer.base import SignerError
from gasless.signer.owner import OwnerSigner

OWNER_GAS = 20_000_000
MAX_GAS = 600_000_000


class OwnerCallError(RuntimeError):
    pass


class OwnerTransactor:
    """Signs calls with the contract owner's key (wherever it is held) and broadcasts them to every
    gateway."""

    def __init__(self, gateway: GatewayClient, signer: OwnerSigner, contract: str, chain_id: str) -> None:
        self.gateway = gateway
        self.signer = signer
        self.contract = contract
        self.chain_id = chain_id
        self.address = signer.address

    async def send(self, function: str, arguments: list[Any], *, gas_limit: int = OWNER_GAS) -> str:
        """Sign and broadcast; returns the transaction hash (OwnerCallError when the key could not sign or
        no gateway accepted it)."""
        account = await self.gateway.account(self.address.to_bech32())
        tx = contract_call(
            abi=load_billing_abi(),
            chain_id=self.chain_id,
            sender=self.address,
            contract=parse_address(self.contract),
            function=function,
            arguments=arguments,
            gas_limit=min(gas_limit, MAX_GAS),
            nonce=int(account.get("nonce", 0)),
        )
        try:
            tx.signature = await self.signer.sign(signing_bytes(tx))
        except SignerError as exc:  # a token that cannot sign now: nothing was sent
            raise OwnerCallError(f"{function} was not signed: {exc}") from exc
        ack = await self.gateway.broadcast(tx.to_dictionary()).first_ack
        if not ack.ok or ack.tx_hash is None:
            raise OwnerCallError(f"{function} was not accepted: {ack.error}")
        return ack.tx_hash

    async def outcome(self, tx_hash: str, *, timeout_s: float = 60.0) -> tuple[str, str | None]:
        """Wait for execution: ("success" | "fail" | "invalid", reason), or ("pending", None) on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            try:
                status = await self.gateway.get(f"/transaction/{tx_hash}/process-status")
            except Exception:  # noqa: BLE001 - not known yet, or a gateway hiccup: ask again
                status = {}
            state = status.get("status")
            if state == "fail":
                # process-status's reason is the VM's return code; the contract's message is in the logs.
                try:
                    full = await self.gateway.transaction(tx_hash)
                except Exception:  # noqa: BLE001 - the code is still a reason
                    full = None
                return state, (contract_failure(full) if full else None) or process_reason(
                    status.get("reason")
                )
            if state in ("success", "invalid"):
                return state, status.get("reason")
            await asyncio.sleep(0.1)
        return "pending", None

    async def call(self, function: str, arguments: list[Any], *, gas_limit: int = OWNER_GAS) -> str:
        """Send and wait for success (OwnerCallError otherwise)."""
        tx_hash = await self.send(function, arguments, gas_limit=gas_limit)
        state, reason = await self.outcome(tx_hash)
        if state != "success":
            raise OwnerCallError(f"{function} {state}: {reason or 'no reason given'} (tx {tx_hash})")
        return tx_hash
