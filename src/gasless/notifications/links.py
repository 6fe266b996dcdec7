"""E-mail verification links: `ev1.<payload>.<mac>`, MAC'd with the `email-verify` purpose key.

The payload names the account, the address, the link's id and its expiry. The purpose key is derived per
environment and chain, so a link minted by another environment never verifies here. Single use is the
database's: opening a link clears its id from the preferences in one conditional UPDATE (any host).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode
from gasless.core.errors import ApiError

LINK_TTL_MS = 86_400_000
VERIFY_PATH = "/notifications/verify"
_PREFIX = "ev1"
_DOMAIN = b"gasless/email-verify/v1|"


@dataclass(frozen=True)
class LinkClaims:
    account: str
    address: str
    token_id: str
    expires_ms: int


def link_refused(reason: str, detail: str) -> ApiError:
    code = "TOKEN_EXPIRED" if reason == "expired" else "TOKEN_INVALID"
    return ApiError(code, detail=detail, details={"reason": reason})


class VerificationLinks:
    def __init__(self, keys: PurposeKeys, base_url: str, *, ttl_ms: int = LINK_TTL_MS) -> None:
        self.keys = keys
        self.base_url = base_url.rstrip("/")
        self.ttl_ms = ttl_ms

    def mint(self, account: str, address: str, now_ms: int) -> tuple[str, LinkClaims]:
        claims = LinkClaims(account, address, secrets.token_hex(16), now_ms + self.ttl_ms)
        payload = json.dumps(
            {
                "a": account,
                "m": address,
                "i": claims.token_id,
                "e": claims.expires_ms,
                "env": self.keys.env,
                "c": self.keys.chain_id,
            },
            separators=(",", ":"),
        ).encode()
        token = f"{_PREFIX}.{b64url(payload)}.{b64url(self.keys.mac('email-verify', _DOMAIN + payload))}"
        return f"{self.base_url}{VERIFY_PATH}?token={token}", claims

    def open(self, token: str, now_ms: int) -> LinkClaims:
        """The claims of an authentic, unexpired link of this environment (not yet used up)."""
        prefix, _, rest = token.partition(".")
        encoded, _, encoded_tag = rest.partition(".")
        try:
            if prefix != _PREFIX or not encoded or not encoded_tag:
                raise ValueError
            payload, tag = b64url_decode(encoded), b64url_decode(encoded_tag)
            doc = json.loads(payload)
            claims = LinkClaims(str(doc["a"]), str(doc["m"]), str(doc["i"]), int(doc["e"]))
            env, chain = str(doc["env"]), str(doc["c"])
        except (ValueError, KeyError, TypeError):
            raise link_refused("malformed", "not a verification link of this service") from None
        if not self.keys.verify("email-verify", _DOMAIN + payload, tag):  # constant-time
            if (env, chain) != (self.keys.env, self.keys.chain_id):
                raise link_refused(
                    "environment",
                    f"this link was sent by the {env} environment on chain {chain}; open it there",
                )
            raise link_refused("signature", "the link did not verify (altered or not ours)")
        if now_ms >= claims.expires_ms:
            raise link_refused(
                "expired", "the verification link expired; save the address again to get a new one"
            )
        return claims
