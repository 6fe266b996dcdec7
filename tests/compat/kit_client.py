"""A client written to the starter kit's behaviour (read at its commit 7a4ea80; no code of the kit here).

Its habits, each as the kit has it:
- the relayer address: `GET /relayer/address/{user}` once, kept in `.relayer_cache.json` for ever, keyed by
  the relayer's base URL and the user, each entry `{"relayerAddress": ..., "timestamp": <ms>}`
  (src/utils/RelayerAddressCache.ts; read back across restarts of the kit and of the service);
- the main agent path (src/validator.ts `submitProof`): a contract call with gasLimit 10 000 000 plus the
  relayer overhead of 50 000, so 10 050 000 (`KIT_GAS_LIMIT`); the JS SDK's plain object posted as
  `{"transaction": ...}` to `/relay`; `txHash` read from a 200;
- on an error it reads the JSON member `error`: a 403 whose `error` contains "register" starts its
  auto-registration (`POST /challenge` with `{"address"}`, then a relay with the `challengeNonce`), and a
  failed registration ends the submission; anything else is retried with the same signed bytes, 3 attempts
  in all, 1 s then 2 s apart;
- scripts/register.ts: `POST /challenge` first, and on failure prints the answer's `error`.
The kit checks no other string of ours (no "Quota exceeded" test: a 429 is retried like any failure); the
facade's 429 `error` starts with "Quota exceeded" as the compat rules promise, checked by the tests.

Plain HTTP (httpx2); transactions signed with multiversx-sdk.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from multiversx_sdk import Address, Transaction, TransactionComputer, UserSecretKey

MIN_GAS_PRICE = 1_000_000_000
ALICE_ADDRESS = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"  # a well-known receiver
KIT_GAS_LIMIT = 10_000_000 + 50_000  # CONFIG.GAS_LIMITS.SUBMIT_PROOF + CONFIG.RELAYER_GAS_OVERHEAD
KIT_ATTEMPTS = 3
_computer = TransactionComputer()


class RelayFailed(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


class AutoRegistrationFailed(RelayFailed):
    """The kit saw "register" in a 403 and tried to register with this relayer; it stops there."""


def plain_object(tx: Transaction) -> dict[str, Any]:
    """The JS SDK's `toPlainObject()`: numbers as numbers, value as a string, data base64 and absent when
    empty, options absent when 0, signature hex; no signature member at all when unsigned."""
    plain: dict[str, Any] = {
        "nonce": tx.nonce,
        "value": str(tx.value),
        "receiver": tx.receiver.to_bech32(),
        "sender": tx.sender.to_bech32(),
        "gasPrice": tx.gas_price,
        "gasLimit": tx.gas_limit,
        "chainID": tx.chain_id,
        "version": tx.version,
        "relayer": tx.relayer.to_bech32() if tx.relayer else None,
    }
    if tx.data:
        plain["data"] = base64.b64encode(tx.data).decode()
    if tx.options:
        plain["options"] = tx.options
    if tx.signature:
        plain["signature"] = tx.signature.hex()
    return {k: v for k, v in plain.items() if v is not None}


class KitClient:
    def __init__(
        self,
        base_url: str,
        workdir: Path,
        *,
        client: Any = None,
        backoff: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.cache_file = workdir / ".relayer_cache.json"
        self.http = client or httpx2.Client(timeout=30)
        self.backoff = backoff  # the kit waits 1 s, then 2 s, between its attempts
        self.attempts = 0
        self.waits: list[float] = []  # the waits between attempts, in seconds
        self.log: list[str] = []  # what the kit would print, one line per event

    def _cache(self) -> dict[str, dict[str, dict[str, Any]]]:
        if not self.cache_file.exists():
            return {}
        return json.loads(self.cache_file.read_text())  # type: ignore[no-any-return]

    def relayer_address(self, user: str) -> str:
        cache = self._cache()
        entry = cache.get(self.base, {}).get(user)
        if entry:
            return str(entry["relayerAddress"])  # never expired, never cleared
        answer = self.http.get(f"{self.base}/relayer/address/{user}")
        if answer.status_code != 200:
            raise RelayFailed(answer.status_code, answer.json())
        address = str(answer.json()["relayerAddress"])
        cache.setdefault(self.base, {})[user] = {
            "relayerAddress": address,
            "timestamp": int(time.time() * 1000),
        }
        self.cache_file.write_text(json.dumps(cache, indent=2))
        return address

    def build(
        self,
        key: UserSecretKey,
        *,
        nonce: int,
        receiver: str,
        data: bytes = b"",
        gas_limit: int = KIT_GAS_LIMIT,
        value: int = 0,
        chain_id: str = "localnet",
        sign: bool = True,
        gas_price: int = MIN_GAS_PRICE,
    ) -> dict[str, Any]:
        sender = Address(key.generate_public_key().buffer, "erd")
        tx = Transaction(
            sender=sender,
            receiver=Address.new_from_bech32(receiver),
            gas_limit=gas_limit,
            chain_id=chain_id,
            nonce=nonce,
            value=value,
            data=data,
            gas_price=gas_price,
            version=2,
            relayer=Address.new_from_bech32(self.relayer_address(sender.to_bech32())),
        )
        if sign:
            tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
        return plain_object(tx)

    def relay(self, transaction: dict[str, Any], **extra: Any) -> str:
        """validator.ts `submitProof`'s broadcast loop, on one signed transaction."""
        body = {"transaction": transaction, **extra}
        failures = 0
        while True:
            self.attempts += 1
            answer = self.http.post(f"{self.base}/relay", json=body)
            payload = answer.json()  # every answer is JSON
            if answer.status_code == 200:
                self.log.append(f"Transaction sent: {payload['txHash']}")
                return str(payload["txHash"])
            message = str(payload.get("error") or f"Request failed with status code {answer.status_code}")
            if answer.status_code == 403 and "register" in message:
                self.log.append("Agent not registered. Initiating Auto-Registration...")
                self.register_with_relayer(str(transaction.get("sender", "")))
                continue  # the kit retries without counting the registration as an attempt
            failures += 1
            self.log.append(f"Tx Broadcast Attempt {failures} failed: {message}")
            if failures >= KIT_ATTEMPTS:
                raise RelayFailed(answer.status_code, payload)
            self.waits.append(1.0 * failures)
            self.backoff(1.0 * failures)

    def register_with_relayer(self, address: str) -> None:
        """The relayer side of the kit's registration: `POST /challenge` (register.ts, validator.ts)."""
        answer = self.http.post(f"{self.base}/challenge", json={"address": address})
        if answer.status_code != 200:
            payload = answer.json() if answer.content else {}
            self.log.append(f"Relaying failed: {payload.get('error') or answer.status_code}")
            raise AutoRegistrationFailed(answer.status_code, payload)
        raise AssertionError(f"this relayer answered a challenge: {answer.text}")
