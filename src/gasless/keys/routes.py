"""Sponsor API key routes: thin adapters from HTTP to ApiKeyService (native-auth, owner-only writes)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Request, Response

from gasless.auth.actions import CHALLENGE_HEADER, SIGNATURE_HEADER
from gasless.auth.deps import AccountRead, AccountRevoke, AccountWrite, account_read
from gasless.http.json_body import api_router
from gasless.keys.schemas import ApiKey, ApiKeyCreate, ApiKeyCreated, ApiKeyList, ApiKeyUpdate
from gasless.limits.route_classes import Caller, account_rate, private_read

router = api_router(tags=["keys"])
KeyIdPath = Annotated[str, Path(max_length=64, description="the key's public id")]
NO_STORE = "no-store"  # key material and account data never sit in a shared or browser cache


def _keys(request: Request) -> Any:
    return request.app.state.host.api_keys


async def _writer(access: AccountWrite) -> Caller:
    return Caller(account=access.account)


async def _revoker(access: AccountRevoke) -> Caller:
    return Caller(account=access.account)


# "Writes on keys, webhooks, notifications": 1 req/s, burst 5 per account, counted after authentication
# (the same access dependency as the route's own, resolved once per request).
WRITE_LIMIT = account_rate("account_write", caller=_writer)
REVOKE_LIMIT = account_rate("account_write", caller=_revoker)
PRIVATE_READ = private_read(account_read)


@router.get(
    "/v1/account/{erd}/keys",
    operation_id="listApiKeys",
    response_model=ApiKeyList,
    dependencies=[PRIVATE_READ],
)
async def list_api_keys(request: Request, response: Response, access: AccountRead) -> ApiKeyList:
    """The account's active keys, oldest first (secrets are never returned again)."""
    response.headers["Cache-Control"] = NO_STORE
    return ApiKeyList(items=await _keys(request).list(access.account))


@router.post(
    "/v1/account/{erd}/keys",
    operation_id="createApiKey",
    response_model=ApiKeyCreated,
    status_code=201,
    dependencies=[WRITE_LIMIT],
)
async def create_api_key(
    request: Request, response: Response, body: ApiKeyCreate, access: AccountWrite
) -> ApiKeyCreated:
    """A new key; its secret is in this response only. Needs a per-action signature by the account's key
    (a key spends the account's plan): the first attempt answers the challenge to sign."""
    response.headers["Cache-Control"] = NO_STORE
    host = request.app.state.host
    assert access.caller is not None  # writes are native-auth only
    await host.actions.require(
        account=access.account,
        operation="createApiKey",
        caller=access.caller.address,
        body=await request.body(),
        challenge=request.headers.get(CHALLENGE_HEADER),
        signature=request.headers.get(SIGNATURE_HEADER),
    )
    created: ApiKeyCreated = await _keys(request).create(access.account, body.label, body.policy)
    return created


@router.patch(
    "/v1/account/{erd}/keys/{keyId}",
    operation_id="updateApiKey",
    response_model=ApiKey,
    dependencies=[WRITE_LIMIT],
)
async def update_api_key(
    request: Request, response: Response, keyId: KeyIdPath, body: ApiKeyUpdate, access: AccountWrite
) -> ApiKey:
    """Change a key's label and/or replace its policy."""
    response.headers["Cache-Control"] = NO_STORE
    updated: ApiKey = await _keys(request).update(access.account, keyId, label=body.label, policy=body.policy)
    return updated


@router.delete(
    "/v1/account/{erd}/keys/{keyId}",
    operation_id="revokeApiKey",
    status_code=204,
    response_class=Response,
    dependencies=[REVOKE_LIMIT],
)
async def revoke_api_key(request: Request, keyId: KeyIdPath, access: AccountRevoke) -> Response:
    """Revoke a key: refused on every host within 2 000 ms (reservations already made still bill)."""
    await _keys(request).revoke(access.account, keyId)
    return Response(status_code=204, headers={"Cache-Control": NO_STORE})
