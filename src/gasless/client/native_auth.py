"""Making native-auth tokens, the SDK's way (NativeAuthClient's format, Account.sign_message's signature).

The token is what a dApp's wallet produces: `NativeAuthClient.initialize` builds the body on a block hash the
caller supplies (instead of fetching the latest block from an API), the wallet signs `address + body` as a
signed message, and `NativeAuthClient.get_token` assembles `b64url(address).b64url(body).hex(signature)`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from multiversx_sdk import Account, Message, UserSecretKey
from multiversx_sdk.native_auth import NativeAuthClient, NativeAuthClientConfig

from gasless.chain.addresses import HRP

_BLOCK_HASH = re.compile(r"[0-9a-fA-F]{64}")


class _FixedBlockClient(NativeAuthClient):
    """NativeAuthClient on a given block hash: no network."""

    def __init__(self, config: NativeAuthClientConfig, block_hash: str) -> None:
        super().__init__(config)
        self._block_hash = block_hash

    def get_current_block_hash(self) -> str:
        return self._block_hash


def make_native_auth_token(
    secret_key: UserSecretKey,
    *,
    origin: str,
    block_hash: str,
    ttl_seconds: int = 86_400,
    extra_info: Mapping[str, Any] | None = None,
) -> str:
    """A native-auth token signed by `secret_key`, for `origin`, issued at block `block_hash`."""
    if not isinstance(origin, str):
        raise TypeError("origin must be a string")
    if not isinstance(block_hash, str) or not _BLOCK_HASH.fullmatch(block_hash):
        raise ValueError("block_hash must be 64 hex digits")
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 0:
        raise ValueError("ttl_seconds must be a non-negative integer")

    client = _FixedBlockClient(NativeAuthClientConfig(origin=origin, expiry_seconds=ttl_seconds), block_hash)
    body = client.initialize(dict(extra_info) if extra_info else None)
    account = Account(secret_key, hrp=HRP)
    signature = account.sign_message(Message(client.get_token_for_signing(account.address, body)))
    return client.get_token(account.address, body, signature.hex())
