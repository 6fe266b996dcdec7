"""The keys a host signs with, in the custody `GASLESS_SIGNER` names: PEM files (`pem`, the default) or a
PKCS#11 token (`pkcs11`, docs/keys.md). The relayer keys (`open_signer`) and the billing contract owner's
key (`open_owner_signer`) are held the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import structlog

from gasless.signer.base import Signer
from gasless.signer.owner import OwnerKeyRefused, OwnerSigner, PemOwnerSigner, Pkcs11OwnerSigner
from gasless.signer.pem import PemSigner
from gasless.signer.pkcs11 import Pkcs11Config, Pkcs11Signer
from gasless.signer.pkcs11_library import Pkcs11Refused, Pkcs11Unavailable

if TYPE_CHECKING:
    from gasless.core.settings import Settings

log = structlog.get_logger("gasless.signer")

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
T = TypeVar("T", Pkcs11Signer, Pkcs11OwnerSigner)


async def open_signer(settings: Settings, waiting: Callable[[str], None]) -> Signer | None:
    """The host's signer. A token that cannot be used yet (absent, unreachable) is tried again, doubling
    the wait up to RETRY_MAX_S, `waiting` told why each time; None when the configuration is refused (a PIN
    the token refuses, a key that can be exported, a shard without a relayer off localnet): the host then
    stays not ready, `waiting` told why, until it is restarted with other settings."""
    if settings.signer == "pem":
        return PemSigner.from_files(settings.relayer_key_files)
    try:
        config = Pkcs11Config.from_settings(settings)
        signer = await _open_token(lambda: Pkcs11Signer.open(config), "signer", waiting)
    except Pkcs11Refused as exc:
        return _refused(waiting, str(exc))
    uncovered = _shards_without_relayer(settings, signer)
    if uncovered:
        await signer.aclose()
        return _refused(waiting, uncovered)
    return signer


async def open_owner_signer(settings: Settings, waiting: Callable[[str], None]) -> OwnerSigner | None:
    """The billing contract owner's key, in the same custody as the relayer keys: its PEM file
    (`owner_key_file`) with the pem signer, its key in the token (`pkcs11_owner_key`) with pkcs11; None
    when this host has none (it never settles usage). A token that cannot be used yet is tried again as
    for the relayer keys (`waiting` told why); OwnerKeyRefused when the key cannot be used as configured
    (`waiting` told why first)."""
    if settings.signer == "pem":
        if settings.owner_key_file is None:
            return None
        try:
            return PemOwnerSigner.from_file(settings.owner_key_file)
        except Exception as exc:  # noqa: BLE001 - OSError, and the SDK's ValueError, IndexError, ...
            reason = f"the owner key file {settings.owner_key_file} cannot be loaded ({type(exc).__name__})"
    else:
        if settings.pkcs11_owner_key is None:
            return None
        try:
            config = Pkcs11Config.for_owner(settings, settings.pkcs11_owner_key)
            return await _open_token(lambda: Pkcs11OwnerSigner.open(config), "owner key", waiting)
        except Pkcs11Refused as exc:
            reason = f"{exc} (GASLESS_PKCS11_OWNER_KEY)"
    waiting(f"owner key: {reason}")
    log.error("the owner key refuses its configuration; the host will not be ready", reason=reason)
    raise OwnerKeyRefused(reason)


async def _open_token(open_blocking: Callable[[], T], what: str, waiting: Callable[[str], None]) -> T:
    """`open_blocking` (a token opened and its keys checked) until it works: Pkcs11Unavailable is tried
    again after RETRY_FIRST_S, doubling up to RETRY_MAX_S, `waiting` told why each time; Pkcs11Refused is
    raised."""
    delay = RETRY_FIRST_S
    while True:
        try:
            return await _open(open_blocking)
        except Pkcs11Unavailable as exc:
            waiting(f"{what}: {exc}")
            log.warning("pkcs11 token not usable yet; retrying", key=what, reason=str(exc), retry_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)


async def _open(open_blocking: Callable[[], T]) -> T:
    """`open_blocking` in a thread; what it opened after its caller was cancelled is closed."""
    opening = asyncio.get_running_loop().run_in_executor(None, open_blocking)
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:

        def close_late(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                done.result().close()

        opening.add_done_callback(close_late)
        raise


def _shards_without_relayer(settings: Settings, signer: Signer) -> str:
    if settings.profile == "localnet":
        return ""
    covered = {relayer.shard for relayer in signer.relayers()}
    missing = [str(shard) for shard in range(settings.network.num_shards) if shard not in covered]
    if not missing:
        return ""
    return f"no relayer key in the token for shard {', '.join(missing)} (GASLESS_PKCS11_RELAYER_KEYS)"


def _refused(waiting: Callable[[str], None], reason: str) -> None:
    waiting(f"signer: {reason}")
    log.error("the signer refuses its configuration; the host will not be ready", reason=reason)
    return None
