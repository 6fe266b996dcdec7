"""POST /v1/validate: the relay checks without signing, storing or sending anything.

A body that does not match the endpoint's schema (ValidateRequest: an object with an object `tx`) is 400
MALFORMED_REQUEST. Anything else is 200: the first problem listed is exactly what `POST /v1/relay` would
answer; independent checks of the same stage are all listed.
"""

from __future__ import annotations

from gasless.chain.codec import tx_hash
from gasless.core.errors import ApiError, problem_document
from gasless.relay.checks import ParsedRelay, all_failures, parse_json_body, parse_relay_body
from gasless.relay.leases import Lease
from gasless.relay.schemas import ValidateProblem, ValidateResponse
from gasless.relay.service import NATIVE, RelayService
from gasless.signer import SignerError


async def validate_submission(self: RelayService, raw: bytes) -> ValidateResponse:
    """Every problem relay would return, without signing, storing or sending anything."""
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        raise ApiError("MALFORMED_REQUEST", detail="body must be a JSON object", details={"field": "body"})
    if not isinstance(body.get("tx"), dict):
        raise ApiError(
            "MALFORMED_REQUEST", detail="`tx` must be a transaction object", details={"field": "tx"}
        )
    try:
        parsed = parse_relay_body(body, None)
    except ApiError as error:
        return _response(self, [error], None)
    problems = all_failures(self._static(parsed))
    if problems:
        return _response(self, problems, parsed)
    try:
        view = await self._sender_view(parsed, self.now_ms())
        if self._duplicate_of(parsed, view) is not None:
            return _response(self, [], parsed)
        lease_checks = self._lease_checks(parsed, view, NATIVE)
        problems = []
        lease: Lease | None = None
        for check in lease_checks[:-1]:
            error = check()
            if error is not None:
                problems.append(error)
                break  # later lease checks read the verified lease
        else:
            lease = lease_checks[-1]()
        signature = self._sender_signature(parsed)
        if signature is not None:
            problems.append(signature)
        if problems or lease is None:
            return _response(self, problems, parsed)
        state = await self._chain_state(parsed.sender, parsed.sender_shard)
        state_checks = self._state_checks(parsed, lease, view, state)
        problems = [e for check in state_checks[:-1] if (e := check()) is not None]
        if problems:
            return _response(self, problems, parsed)
        await self._entitle(parsed.tx, parsed.sender, None, parsed.account)
        await self._simulate(parsed, self.network.params)
    except ApiError as error:
        return _response(self, [*problems, error] if problems else [error], parsed)
    try:
        self.signer.check()
    except SignerError as exc:
        return _response(self, [ApiError(exc.code, detail=str(exc))], parsed)
    return _response(self, [], parsed)


def _response(self: RelayService, problems: list[ApiError], parsed: ParsedRelay | None) -> ValidateResponse:
    documents = [
        ValidateProblem(
            **{
                k: v
                for k, v in problem_document(p, docs_url=self.config.docs_url, request_id="").items()
                if k in ValidateProblem.model_fields
            }
        )
        for p in problems
    ]
    return ValidateResponse(
        ok=not problems, problems=documents, txHash=tx_hash(parsed.tx) if parsed is not None else None
    )
