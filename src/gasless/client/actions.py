"""Per-action signatures on the integrator's side (see `gasless.auth.actions` for the protocol).

The client never signs what the server asks blindly: it rebuilds the message from its own request body and
the challenge, checks that it is the message the server showed, and signs that.
"""

from __future__ import annotations

import json
from typing import Any

from gasless.auth.actions import CHALLENGE_HEADER, SIGNATURE_HEADER, action_message
from gasless.client.keys import TxSigner
from gasless.core.crypto import b64url_decode


class ActionChallengeMismatch(ValueError):
    """The server asked to sign something other than this request."""


def action_headers(signer: TxSigner, operation: str, body: bytes, details: dict[str, Any]) -> dict[str, str]:
    """The headers that answer a challenge (`details` of ACTION_SIGNATURE_INVALID / CHALLENGE_INVALID)."""
    challenge = str(details["challenge"])
    claims = json.loads(b64url_decode(challenge.split(".")[0]))
    if claims.get("account") != signer.address or claims.get("op") != operation:
        raise ActionChallengeMismatch("the challenge names another account or action")
    message = action_message(str(claims["chainId"]), signer.address, operation, body, challenge)
    if details.get("message") not in (None, message.decode()):
        raise ActionChallengeMismatch("the server's message is not the one this request implies")
    return {CHALLENGE_HEADER: challenge, SIGNATURE_HEADER: signer.sign(message).hex()}
