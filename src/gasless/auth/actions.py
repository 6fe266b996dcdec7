"""Per-action signatures: the account's own key confirms one sensitive change (docs/auth.md, "Per-action
signatures and challenges").

A native-auth token proves who calls; it lives for its whole validity and sits in a browser. Some actions
hand out the account's money (creating a sponsor API key lets whoever holds the key spend the account's
plan), so they also need a fresh signature by the account's key over exactly this request. The route
issues its own challenge (no separate challenge route):

1. An attempt without `X-Action-Signature` answers `403 ACTION_SIGNATURE_INVALID` whose `details` carry a
   `challenge`, the exact `message` to sign and `expiresAtMs`.
2. The client signs the message bytes with the account's key (raw Ed25519, as the assign presence proof)
   and repeats the same request with `X-Action-Challenge: <challenge>` and `X-Action-Signature: <hex>`.

    message   = "action/v1|<chainId>|<account>|<operationId>|<sha256 hex of the body's RFC 8785 JSON>|<challenge>"
    challenge = b64url(json payload) "." b64url(HMAC-SHA256 under the `action` purpose key)
    payload   = {v, env, chainId, account, op, caller, id, iat, exp}

A challenge that is malformed, forged, expired, from another environment, for another account, operation
or caller, or already used gives `401 CHALLENGE_INVALID`; a signature that does not verify gives
`403 ACTION_SIGNATURE_INVALID`. Each problem carries a fresh challenge so the client can retry at once.
A challenge is single use on every host: Redis `SET NX` when configured (two hosts always have Redis),
otherwise an in-process set (the embedded default is one host).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import rfc8785
from redis.asyncio import Redis

from gasless.chain.addresses import parse_address
from gasless.chain.codec import verify_ed25519
from gasless.core.crypto import PurposeKeys, b64url, b64url_decode
from gasless.core.errors import ApiError

CHALLENGE_TTL_MS = 120_000
CHALLENGE_HEADER = "X-Action-Challenge"
SIGNATURE_HEADER = "X-Action-Signature"
MAX_CHALLENGE_CHARS = 1_024


def body_digest(body: bytes) -> str:
    """SHA-256 (hex) of the body's RFC 8785 canonical JSON (of nothing for an empty body): any client's
    JSON spelling of the same request signs the same message."""
    if not body.strip():
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(rfc8785.dumps(json.loads(body))).hexdigest()


def action_message(chain_id: str, account: str, operation: str, body: bytes, challenge: str) -> bytes:
    return f"action/v1|{chain_id}|{account}|{operation}|{body_digest(body)}|{challenge}".encode()


@dataclass(frozen=True)
class Challenge:
    token: str
    expires_ms: int


class ActionSignatures:
    """Issues challenges and checks per-action signatures for one environment on one chain."""

    def __init__(
        self,
        keys: PurposeKeys,
        *,
        redis: Redis | None = None,
        namespace: str = "gasless",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.redis = redis
        self.namespace = namespace
        self.clock = clock
        self._used: dict[str, int] = {}  # challenge id -> expiry ms (single host without Redis)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # Challenges --------------------------------------------------------------------------------------
    def issue(self, account: str, operation: str, caller: str) -> Challenge:
        now = self.now_ms()
        payload = {
            "v": 1,
            "env": self.keys.env,
            "chainId": self.keys.chain_id,
            "account": account,
            "op": operation,
            "caller": caller,
            "id": secrets.token_hex(12),
            "iat": now,
            "exp": now + CHALLENGE_TTL_MS,
        }
        body = b64url(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        tag = b64url(self.keys.mac("action", body.encode()))
        return Challenge(f"{body}.{tag}", payload["exp"])

    def _payload(self, token: str) -> dict[str, Any] | None:
        if not isinstance(token, str) or len(token) > MAX_CHALLENGE_CHARS or token.count(".") != 1:
            return None
        body, tag = token.split(".")
        try:
            raw_tag = b64url_decode(tag)
            # One spelling only: a second base64 spelling of the same MAC must not verify.
            if b64url(raw_tag) != tag or not self.keys.verify("action", body.encode(), raw_tag):
                return None
            raw = b64url_decode(body)
            if b64url(raw) != body:
                return None
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        return payload if isinstance(payload, dict) else None

    # The check ---------------------------------------------------------------------------------------
    async def require(
        self,
        *,
        account: str,
        operation: str,
        caller: str,
        body: bytes,
        challenge: str | None,
        signature: str | None,
    ) -> None:
        """Return when the request carries a valid, unused challenge signed by the account; else ApiError."""
        if challenge is None and signature is None:
            raise self._refusal(
                "ACTION_SIGNATURE_INVALID",
                f"this action needs a signature by {account}'s key: sign details.message and repeat the "
                f"request with the {CHALLENGE_HEADER} and {SIGNATURE_HEADER} headers",
                account,
                operation,
                caller,
                body,
            )
        payload = self._payload(challenge or "")
        now = self.now_ms()
        reason = None
        if payload is None:
            reason = "the challenge is malformed or was not issued here"
        elif payload.get("env") != self.keys.env or payload.get("chainId") != self.keys.chain_id:
            reason = "the challenge was issued for another environment"
        elif (payload.get("account"), payload.get("op"), payload.get("caller")) != (
            account,
            operation,
            caller,
        ):
            reason = "the challenge was issued for another account, action or caller"
        elif not isinstance(payload.get("exp"), int) or payload["exp"] <= now:
            reason = "the challenge has expired"
        if reason is not None:
            raise self._refusal("CHALLENGE_INVALID", reason, account, operation, caller, body)
        assert challenge is not None and payload is not None
        try:
            raw_signature = bytes.fromhex(signature or "")
        except ValueError:
            raw_signature = b""
        message = action_message(self.keys.chain_id, account, operation, body, challenge)
        pubkey = parse_address(account).get_public_key()
        if not verify_ed25519(pubkey, message, raw_signature):
            raise self._refusal(
                "ACTION_SIGNATURE_INVALID",
                f"the {SIGNATURE_HEADER} signature does not verify for {account} over details.message",
                account,
                operation,
                caller,
                body,
            )
        if not await self._consume(str(payload.get("id")), int(payload["exp"])):
            raise self._refusal(
                "CHALLENGE_INVALID", "the challenge was already used", account, operation, caller, body
            )

    async def _consume(self, challenge_id: str, expires_ms: int) -> bool:
        ttl_ms = max(1, expires_ms - self.now_ms())
        if self.redis is not None:
            key = f"{self.namespace}:{self.keys.env}:{self.keys.chain_id}:action:{challenge_id}"
            return bool(await self.redis.set(key, b"1", nx=True, px=ttl_ms))
        now = self.now_ms()
        if len(self._used) > 10_000:
            self._used = {cid: exp for cid, exp in self._used.items() if exp > now}
        if challenge_id in self._used:
            return False
        self._used[challenge_id] = expires_ms
        return True

    def _refusal(
        self, code: str, detail: str, account: str, operation: str, caller: str, body: bytes
    ) -> ApiError:
        fresh = self.issue(account, operation, caller)
        return ApiError(
            code,
            detail=detail,
            details={
                "challenge": fresh.token,
                "message": action_message(self.keys.chain_id, account, operation, body, fresh.token).decode(),
                "expiresAtMs": fresh.expires_ms,
            },
        )
