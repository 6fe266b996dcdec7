"""The relayer keys a host signs with: PEM files (`GASLESS_SIGNER=pem`, the default) or a PKCS#11 token
(`pkcs11`, docs/keys.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from gasless.signer.base import Signer
from gasless.signer.pem import PemSigner
from gasless.signer.pkcs11 import Pkcs11Config, Pkcs11Refused, Pkcs11Signer, Pkcs11Unavailable

if TYPE_CHECKING:
    from gasless.settings import Settings

log = structlog.get_logger("gasless.signer")

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


async def open_signer(settings: Settings, waiting: Callable[[str], None]) -> Signer | None:
    """The host's signer. A token that cannot be used yet (absent, unreachable) is tried again, doubling
    the wait up to RETRY_MAX_S, `waiting` told why each time; None when the configuration is refused (a PIN
    the token refuses, a key that can be exported, a shard without a relayer off localnet): the host then
    stays not ready, `waiting` told why, until it is restarted with other settings."""
    if settings.signer == "pem":
        return PemSigner.from_files(settings.relayer_key_files)
    try:
        config = Pkcs11Config.from_settings(settings)
    except Pkcs11Refused as exc:
        return _refused(waiting, str(exc))
    delay = RETRY_FIRST_S
    while True:
        try:
            signer = await _open(config)
        except Pkcs11Refused as exc:
            return _refused(waiting, str(exc))
        except Pkcs11Unavailable as exc:
            waiting(f"signer: {exc}")
            log.warning("pkcs11 token not usable yet; retrying", reason=str(exc), retry_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        uncovered = _shards_without_relayer(settings, signer)
        if uncovered:
            await signer.aclose()
            return _refused(waiting, uncovered)
        return signer


async def _open(config: Pkcs11Config) -> Pkcs11Signer:
    """Pkcs11Signer.open in a thread; a signer opened after its caller was cancelled is closed."""
    opening = asyncio.get_running_loop().run_in_executor(None, Pkcs11Signer.open, config)
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:

        def close_late(done: asyncio.Future[Pkcs11Signer]) -> None:
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
