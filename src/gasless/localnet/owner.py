"""Owner operations on localnet's billing contract, sent as real signed transactions through a gateway."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from multiversx_sdk import TransactionComputer

from gasless.chain.abi import load_billing_abi
from gasless.chain.addresses import parse_address
from gasless.chain.calls import contract_call
from gasless.chain.outcomes import contract_failure, process_reason
from gasless.localnet.genesis import Wallet

OWNER_CALL_GAS = 20_000_000


class OwnerCallFailed(RuntimeError):
    pass


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        body = await resp.json()
    if body.get("error"):
        raise OwnerCallFailed(body["error"])
    return body["data"]


async def owner_call(
    gateway: str,
    owner: Wallet,
    contract: str,
    function: str,
    arguments: list[Any],
    *,
    chain_id: str = "localnet",
    timeout_s: float = 30.0,
) -> str:
    """Sign `function(arguments)` with the owner key, send it, and wait until it executed successfully."""
    async with aiohttp.ClientSession() as http:
        nonce = (await _get(http, f"{gateway}/address/{owner.address.to_bech32()}/nonce"))["nonce"]
        tx = contract_call(
            abi=load_billing_abi(),
            chain_id=chain_id,
            sender=owner.address,
            contract=parse_address(contract),
            function=function,
            arguments=arguments,
            gas_limit=OWNER_CALL_GAS,
            nonce=nonce,
        )
        tx.signature = owner.secret_key.sign(TransactionComputer().compute_bytes_for_signing(tx))
        async with http.post(f"{gateway}/transaction/send", json=tx.to_dictionary()) as resp:
            body = await resp.json()
        if body.get("error"):
            raise OwnerCallFailed(body["error"])
        tx_hash = body["data"]["txHash"]
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            status = await _get(http, f"{gateway}/transaction/{tx_hash}/process-status")
            if status["status"] == "success":
                return str(tx_hash)
            if status["status"] == "fail":
                # process-status's reason is the VM's return code; the contract's message is in the logs.
                full = await _get(http, f"{gateway}/transaction/{tx_hash}?withResults=true")
                reason = contract_failure(full["transaction"]) or process_reason(status.get("reason"))
                raise OwnerCallFailed(f"{function} failed: {reason}")
            await asyncio.sleep(0.05)
    raise OwnerCallFailed(f"{function} did not execute within {timeout_s} s")


async def unpause(gateway: str, owner: Wallet, contract: str, *, chain_id: str = "localnet") -> str:
    """The embedded default's start-up step: the owner lifts the deployment pause."""
    return await owner_call(gateway, owner, contract, "setPaused", [False], chain_id=chain_id)
