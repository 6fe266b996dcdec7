"""A client written to the starter kit's behaviour (issue 14): it asks `GET /relayer/address/{user}` once
and keeps the answer in `.relayer_cache.json` forever (keyed by base URL and user), posts
`{"transaction": <JS SDK plain object>}` to `/relay`, reads `txHash` on 200 and `error` otherwise,
recognises a 403 whose error mentions registration, and retries anything else up to 3 times with the same
signed bytes. Plain HTTP (httpx2); transactions signed with multiversx-sdk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
from multiversx_sdk import Address, Transaction, TransactionComputer, UserSecretKey

MIN_GAS_PRICE = 1_000_000_000
ALICE_ADDRESS = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"  # a well-known receiver
_computer = TransactionComputer()


class NeedsRegistration(Exception):
    pass


class RelayFailed(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


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
        import base64

        plain["data"] = base64.b64encode(tx.data).decode()
    if tx.options:
        plain["options"] = tx.options
    if tx.signature:
        plain["signature"] = tx.signature.hex()
    return {k: v for k, v in plain.items() if v is not None}


class KitClient:
    def __init__(self, base_url: str, workdir: Path, *, client: Any = None) -> None:
        self.base = base_url.rstrip("/")
        self.cache_file = workdir / ".relayer_cache.json"
        self.http = client or httpx2.Client(timeout=30)
        self.attempts = 0

    def _cache(self) -> dict[str, dict[str, str]]:
        if not self.cache_file.exists():
            return {}
        return json.loads(self.cache_file.read_text())  # type: ignore[no-any-return]

    def relayer_address(self, user: str) -> str:
        cache = self._cache()
        cached = cache.get(self.base, {}).get(user)
        if cached:
            return cached  # never expired, never cleared
        answer = self.http.get(f"{self.base}/relayer/address/{user}")
        if answer.status_code != 200:
            raise RelayFailed(answer.status_code, answer.json())
        address = str(answer.json()["relayerAddress"])
        cache.setdefault(self.base, {})[user] = address
        self.cache_file.write_text(json.dumps(cache))
        return address

    def build(
        self,
        key: UserSecretKey,
        *,
        nonce: int,
        receiver: str,
        data: bytes = b"",
        gas_limit: int = 100_000,
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
        body = {"transaction": transaction, **extra}
        last: Any = None
        for _ in range(3):
            self.attempts += 1
            answer = self.http.post(f"{self.base}/relay", json=body)
            payload = answer.json()  # every answer is JSON
            if answer.status_code == 200:
                return str(payload["txHash"])
            if answer.status_code == 403 and "register" in str(payload.get("error", "")):
                raise NeedsRegistration(payload["error"])
            last = RelayFailed(answer.status_code, payload)
        raise last
