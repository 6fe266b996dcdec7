"""`GET /v1/usage/{txHash}/proof`: thin adapter to the proof service."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Request

from gasless.auth.deps import ApiKeyHeader, AuthorizationHeader, read_access_to
from gasless.core.errors import ApiError
from gasless.http.formats import TxHash
from gasless.http.json_body import api_router
from gasless.limits.route_classes import limit_private_read
from gasless.settlement.proofs import UsageProof

router = api_router(tags=["usage"])


def _proofs(request: Request) -> Any:
    host = request.app.state.host
    if host.proof_service is None:
        raise host.unavailable()
    return host.proof_service


@router.get(
    "/v1/usage/{txHash}/proof",
    operation_id="getUsageProof",
    response_model=UsageProof,
    summary="Merkle inclusion proof of a usage row against its batch's on-chain usage_root",
)
async def get_usage_proof(
    request: Request,
    tx_hash: Annotated[TxHash, Path(alias="txHash", description="64-hex transaction hash")],
    authorization: AuthorizationHeader,
    api_key: ApiKeyHeader,
) -> UsageProof:
    tx_hash = tx_hash.lower()
    if authorization is None and api_key is None:
        # Credentials first: an anonymous caller learns nothing about which rows exist.
        await read_access_to(request, "", authorization, api_key)
    service = _proofs(request)
    account = await service.account_of(tx_hash)
    if account is None:  # a dead row nobody paid for: never settled
        raise ApiError("NOT_FOUND", detail="the row is not billed: it is never settled and has no proof")
    access = await read_access_to(request, account, authorization, api_key)
    await limit_private_read(request, access.account)
    proof: UsageProof = await service.proof(tx_hash)
    return proof
