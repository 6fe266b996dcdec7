"""The integrator's flow: assign, build, sign once, relay, and recover exactly as the catalogue says.

| answer | what the flow does |
|---|---|
| 200 / 202 | done (`SendResult`) |
| `LEASE_EXPIRED`, `details.renewable` true | assign with `renewFor` = the signed tx, resend the same bytes |
| `LEASE_EXPIRED`, `renewable` false | assign again, rebuild with the same nonce, sign again (once) |
| resign `NEW_SIGNATURE_SAME_NONCE` (`RESIGN_REQUIRED`, `RESIGN_SAME_NONCE`) | rebuild with `details.assignment` (same nonce, gas price at least `details.minGasPrice`), sign again (once) |
| retryable, resign `SAME_BYTES` | wait `details.retryAfterMs` / `Retry-After` (else a backoff), resend the same bytes |
| no answer (connection lost, timeout) | resend the same bytes: the service answers a repeat with `duplicate: true` |
| anything else (resign `NONE`) | raise the `RelayProblem` |

Attempts and the total time spent waiting are bounded (`max_attempts`, `max_wait_s`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from multiversx_sdk import Transaction

from gasless.client.build import BuildContext, TxBuilder
from gasless.client.keys import TxSigner
from gasless.client.problems import RelayProblem
from gasless.client.results import RelayResult


class RelayCalls(Protocol):
    """The calls of `RelayClient` the flow makes (the client passes itself)."""

    async def network_chain_id(self) -> str: ...

    async def assign(
        self,
        signer: TxSigner,
        *,
        renew_for: Transaction | Mapping[str, Any] | None = None,
        cancel: int | None = None,
        kind: str = "key",
        bearer: str | None = None,
    ) -> dict[str, Any]: ...

    async def relay(
        self,
        tx: Transaction | Mapping[str, Any],
        lease: str,
        *,
        intent_key: str | None = None,
        api_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> RelayResult: ...


MAX_SINGLE_WAIT_S = 10.0


@dataclass
class SendResult:
    """The accepted answer, the signed transaction it is for, the lease used, and what it took."""

    result: RelayResult
    tx: Transaction
    assignment: dict[str, Any]
    steps: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.result.id

    @property
    def tx_hash(self) -> str:
        return self.result.tx_hash

    @property
    def status(self) -> int:
        return self.result.status


class ResignLimitReached(RuntimeError):
    """The flow had to re-sign a second time; it signs again at most once."""


def backoff_s(attempt: int) -> float:
    return min(0.25 * 2 ** max(0, attempt - 1), 5.0)


def sign_built(signer: TxSigner, builder: TxBuilder, ctx: BuildContext) -> Transaction:
    """Build for `ctx` and have the sender sign; the builder must keep sender, relayer and nonce."""
    tx = builder(ctx)
    if tx.sender.to_bech32() != signer.address:
        raise ValueError(f"the builder made a transaction from {tx.sender.to_bech32()}, not {signer.address}")
    if tx.relayer is None or tx.relayer.to_bech32() != ctx.relayer:
        raise ValueError("the builder must set `relayer` to the assigned relayer")
    if ctx.nonce is not None and tx.nonce != ctx.nonce:
        raise ValueError(f"re-signing must keep nonce {ctx.nonce}; the builder made {tx.nonce}")
    if tx.relayer_signature:
        raise ValueError("the user's transaction must not carry a relayer signature")
    tx.signature = signer.sign_transaction(tx)
    return tx


async def send_flow(
    client: RelayCalls,
    signer: TxSigner,
    builder: TxBuilder,
    *,
    assignment: Mapping[str, Any] | None = None,
    intent_key: str | None = None,
    api_key: str | None = None,
    kind: str = "key",
    max_attempts: int = 6,
    max_wait_s: float = 30.0,
) -> SendResult:
    chain_id = await client.network_chain_id()
    steps: list[str] = []
    if assignment is None:
        assignment = await client.assign(signer, kind=kind)
        steps.append("assign")
    current = dict(assignment)
    tx = sign_built(signer, builder, BuildContext(signer.address, chain_id, current))
    nonce = tx.nonce
    resigned = False
    waited = 0.0

    async def resign(new_assignment: Mapping[str, Any], min_gas_price: int | None, why: str) -> None:
        nonlocal tx, current, resigned
        if resigned:
            raise ResignLimitReached(f"{why}: the flow signs again at most once")
        resigned = True
        current = dict(new_assignment)
        ctx = BuildContext(signer.address, chain_id, current, min_gas_price=min_gas_price, nonce=nonce)
        tx = sign_built(signer, builder, ctx)
        steps.append(f"resign:{why}")

    async def wait(delay: float, problem: BaseException) -> None:
        nonlocal waited
        delay = min(max(0.0, delay), MAX_SINGLE_WAIT_S)
        if waited + delay > max_wait_s:
            raise problem
        waited += delay
        steps.append(f"wait:{delay:.3f}")
        await asyncio.sleep(delay)

    last: BaseException | None = None
    for attempt in range(1, max_attempts + 1):
        try:
            result = await client.relay(tx, current["lease"], intent_key=intent_key, api_key=api_key)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # No answer: the request may or may not have reached the commit point. Identical bytes are
            # idempotent (a repeat answers `duplicate: true`), so resending them is always safe.
            steps.append(f"relay:{type(exc).__name__}")
            last = exc
            if attempt < max_attempts:
                await wait(backoff_s(attempt), exc)
            continue
        except RelayProblem as problem:
            steps.append(f"relay:{problem.code}")
            last = problem
            if attempt == max_attempts:
                break
            if problem.code == "LEASE_EXPIRED":
                if problem.details.get("renewable") is True:
                    try:
                        current = await client.assign(signer, renew_for=tx, kind=kind)
                        steps.append("assign:renew")
                    except RelayProblem as renewal:
                        if (
                            renewal.resign != "NEW_SIGNATURE_SAME_NONCE"
                            or "assignment" not in renewal.details
                        ):
                            raise
                        steps.append(f"assign:{renewal.code}")
                        await resign(
                            renewal.details["assignment"], renewal.details.get("minGasPrice"), renewal.code
                        )
                else:
                    fresh = await client.assign(signer, kind=kind)
                    steps.append("assign")
                    await resign(fresh, None, problem.code)
                continue
            if problem.resign == "NEW_SIGNATURE_SAME_NONCE":
                new_assignment = problem.details.get("assignment")
                if not isinstance(new_assignment, Mapping):
                    raise
                await resign(new_assignment, problem.details.get("minGasPrice"), problem.code)
                continue
            if problem.retryable and problem.resign == "SAME_BYTES":
                await wait(problem.retry_after_s or backoff_s(attempt), problem)
                continue
            raise
        else:
            steps.append(f"relay:{result.status}")
            return SendResult(result, tx, current, steps)
    assert last is not None
    raise last
