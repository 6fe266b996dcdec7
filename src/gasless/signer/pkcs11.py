"""Keys held in a PKCS#11 token that sign inside it: Ed25519 keys (`CKK_EC_EDWARDS`) signing with
`CKM_EDDSA`, never read out of the token (`CKA_SENSITIVE` true, `CKA_EXTRACTABLE` false). One code path for
every PKCS#11 module: SoftHSM, YubiHSM, CloudHSM, the PKCS#11 libraries of cloud KMSs (docs/keys.md).

Three layers, in three modules:

- `pkcs11_library.Pkcs11Module`: one loaded PKCS#11 library per process, shared by everything that uses it
  (refcounted), its login and sessions, re-initialised once no call is under way.
- `pkcs11_keys`: which key (`KeyRef`), finding and checking it, importing and generating keys.
- here, `Pkcs11Signer`: the `Signer`. Signatures are made by a small pool of threads, each with its own
  session (a PKCS#11 session is one caller at a time); the event loop only waits for them, so the relay's
  deadline (`sign_with_deadline`) applies as with PEM keys: a signature not back in time is discarded, and
  one still queued when its deadline passes is never made. Every signature is verified against the key's
  public key before it is returned: a signature is whole and valid, or the signer refuses. A watch thread
  per signer: every LIVENESS_S it checks that the keys are still in the token; once the token failed,
  `check()` and `sign()` refuse at once (`SIGNER_UNAVAILABLE`) and every RECOVERY_S it tries the token
  again (re-initialising the module when a session alone does not do), until every key signs again.

The relayer keys and the billing contract owner's key (`signer.owner`) are both signed with through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from gasless.chain.addresses import address_of
from gasless.signer.base import RelayerKey, SignerUnavailable
from gasless.signer.pkcs11_keys import KeyRef, TokenKey, key_pair, private_key
from gasless.signer.pkcs11_library import (
    Pkcs11Module,
    Pkcs11PinRefused,
    Pkcs11Refused,
    Pkcs11Unavailable,
    acquire_module,
    read_pin,
    release_module,
    signer_failure,
)

if TYPE_CHECKING:
    from pkcs11 import Session

    from gasless.core.settings import Settings

log = structlog.get_logger("gasless.signer")

LIVENESS_S = 2.0  # how often a healthy signer checks that its keys are still in the token
RECOVERY_S = 1.0  # how often a signer whose token failed tries it again
STOP_WAIT_S = 5.0  # how long `close` waits for the signing threads


@dataclass(frozen=True)
class Pkcs11Config:
    module: Path
    token_label: str
    pin: str = field(repr=False)
    keys: tuple[KeyRef, ...]
    sessions: int = 4
    purpose: str = "relayer"  # what the keys sign for: "relayer" or "owner" (the logs and messages say it)

    @classmethod
    def from_settings(cls, settings: Settings) -> Pkcs11Config:
        """The relayer signer's configuration; the PIN read from GASLESS_PKCS11_PIN or the file it names
        (Pkcs11Refused when the file cannot be read)."""
        assert settings.pkcs11_module is not None and settings.pkcs11_token_label is not None
        return cls(
            module=settings.pkcs11_module,
            token_label=settings.pkcs11_token_label,
            pin=_settings_pin(settings),
            keys=tuple(KeyRef.parse(ref) for ref in settings.pkcs11_relayer_keys),
            sessions=settings.pkcs11_sessions,
        )

    @classmethod
    def for_owner(cls, settings: Settings, ref: str, *, pin: str | None = None) -> Pkcs11Config:
        """The billing contract owner's key `ref` (label:NAME or id:HEX) in the same token as the relayer
        keys, signed with by one session; the PIN given, else read as for the relayer keys (ValueError for
        a malformed reference, Pkcs11Refused when the PIN file cannot be read)."""
        assert settings.pkcs11_module is not None and settings.pkcs11_token_label is not None
        return cls(
            module=settings.pkcs11_module,
            token_label=settings.pkcs11_token_label,
            pin=pin if pin is not None else _settings_pin(settings),
            keys=(KeyRef.parse(ref),),
            sessions=1,
            purpose="owner",
        )


def _settings_pin(settings: Settings) -> str:
    secret = settings.pkcs11_pin.get_secret_value() if settings.pkcs11_pin is not None else None
    return read_pin(secret, settings.pkcs11_pin_file)


# The signer -------------------------------------------------------------------------------------------
@dataclass
class _Held:
    """A thread's session and the private key objects of every relayer in it."""

    session: Session
    keys: list[Any]
    generation: int


_STOP = object()


class Pkcs11Signer:
    """Co-signs with Ed25519 keys held in a PKCS#11 token (see the module's docstring)."""

    def __init__(self, config: Pkcs11Config, module: Pkcs11Module, keys: Sequence[TokenKey]) -> None:
        self.config = config
        self.module = module
        self.keys = list(keys)
        self._relayers = [RelayerKey(address_of(key.pubkey), key.shard) for key in keys]
        self._index = {relayer.bech32: i for i, relayer in enumerate(self._relayers)}
        self._verify = [VerifyKey(key.pubkey) for key in keys]
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the watch thread's: a loss or the stop, without waiting its tick
        self._counted = threading.Lock()
        self._closed = False
        self._down: str | None = None
        self._pin_refused = False
        self._threads = [
            threading.Thread(target=self._work, name=f"pkcs11-signer-{i}", daemon=True)
            for i in range(config.sessions)
        ]
        self._threads.append(threading.Thread(target=self._watch, name="pkcs11-watch", daemon=True))
        self.signatures = 0  # made by the token and verified (each one was returned or discarded late)

    @classmethod
    def open(cls, config: Pkcs11Config) -> Pkcs11Signer:
        """Load the module, log in, find and check every relayer key (blocking; run it in a thread).
        Pkcs11Refused: the configuration is wrong; Pkcs11Unavailable: the token cannot be used now."""
        if not config.keys:
            raise Pkcs11Refused("no relayer key named: set GASLESS_PKCS11_RELAYER_KEYS")
        module = acquire_module(config.module)
        try:
            module.login(config.token_label, config.pin)
            try:
                keys = cls._find(module, config)
            except BaseException:
                module.logout(config.token_label)
                raise
        except BaseException:
            release_module(module)
            raise
        signer = cls(config, module, keys)
        for thread in signer._threads:
            thread.start()
        log.info(
            "pkcs11 signer ready",
            token=config.token_label,
            purpose=config.purpose,
            addresses=[key.address for key in keys],
            sessions=config.sessions,
        )
        return signer

    @staticmethod
    def _find(module: Pkcs11Module, config: Pkcs11Config) -> list[TokenKey]:
        from pkcs11.exceptions import PKCS11Error

        with module.gate.call():
            try:
                module.ensure_login(config.token_label)
                session = module.token(config.token_label).open()
            except PKCS11Error as exc:
                raise signer_failure(exc, f"opening a session on the token {config.token_label!r}") from None
            try:
                keys = [key_pair(session, ref)[1] for ref in config.keys]
            except PKCS11Error as exc:
                raise signer_failure(exc, f"reading the {config.purpose} keys") from None
            finally:
                with contextlib.suppress(PKCS11Error):
                    session.close()
        addresses = [key.address for key in keys]
        twice = sorted({a for a in addresses if addresses.count(a) > 1})
        if twice:
            raise Pkcs11Refused(
                f"the same key is named twice in GASLESS_PKCS11_RELAYER_KEYS: {', '.join(twice)}"
            )
        return keys

    # Signer --------------------------------------------------------------------------------------------
    def relayers(self) -> list[RelayerKey]:
        return list(self._relayers)

    def unavailable(self) -> str | None:
        """Why the token cannot sign now (None: it can); `/readyz` reports it (FencedSigner.readiness)."""
        return self._down

    def check(self) -> None:
        if self._closed:
            raise SignerUnavailable("the PKCS#11 signer is stopped")
        if self._down is not None:
            raise Pkcs11Unavailable(f"the PKCS#11 token cannot sign: {self._down}")

    async def sign(self, relayer: str, message: bytes) -> bytes:
        index = self._index.get(relayer)
        if index is None:
            raise SignerUnavailable(f"no key loaded for relayer {relayer}")
        self.check()
        future: Future[bytes] = Future()
        self._jobs.put((future, index, bytes(message)))
        # Cancelled by the deadline while still queued, the job is skipped: that signature is never made.
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop the threads (each closes its session), log out, release the module (blocking)."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._wake.set()
        for _ in range(self.config.sessions):
            self._jobs.put(_STOP)
        deadline = time.monotonic() + STOP_WAIT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = [thread.name for thread in self._threads if thread.is_alive()]
        if hung:
            # A thread still inside the module: finalising it under that call is undefined, so it stays.
            log.warning("pkcs11 signer threads did not stop; the module stays loaded", threads=hung)
        else:
            self.module.logout(self.config.token_label)
        release_module(self.module, finalize=not hung)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # Threads -------------------------------------------------------------------------------------------
    def _open_held(self) -> _Held:
        """A session of this thread with every relayer's private key object (called under the gate)."""
        from pkcs11.exceptions import PKCS11Error

        generation = self.module.generation
        try:
            self.module.ensure_login(self.config.token_label)
            session = self.module.token(self.config.token_label).open()
        except PKCS11Error as exc:
            raise signer_failure(exc, "opening a session") from None
        try:
            keys = [private_key(session, ref) for ref in self.config.keys]
        except BaseException:
            with contextlib.suppress(PKCS11Error):
                session.close()
            raise
        return _Held(session, keys, generation)

    def _drop(self, held: _Held | None) -> None:
        """Close a session (unless the module was re-initialised since: its handle may be another's now)."""
        if held is None:
            return
        with self.module.gate.call(), contextlib.suppress(Exception):
            if held.generation == self.module.generation:
                held.session.close()

    def _work(self) -> None:
        from pkcs11 import Mechanism
        from pkcs11.exceptions import PKCS11Error

        held: _Held | None = None
        while True:
            job = self._jobs.get()
            if job is _STOP:
                break
            future, index, message = job
            if not future.set_running_or_notify_cancel():
                continue  # its deadline passed while it waited: never signed
            try:
                self.check()
                with self.module.gate.call():
                    if held is None or held.generation != self.module.generation:
                        held = self._open_held()
                    signature = bytes(held.keys[index].sign(message, mechanism=Mechanism.EDDSA))
                self._verify[index].verify(message, signature)
            except (PKCS11Error, SignerUnavailable, BadSignatureError, ValueError) as exc:
                if isinstance(exc, (BadSignatureError, ValueError)):
                    failure: SignerUnavailable = Pkcs11Unavailable("the token's signature does not verify")
                else:
                    failure = signer_failure(exc, "signing")
                if not self._closed:
                    self._lose(str(failure))
                self._drop(held)
                held = None
                # Nothing was signed: the relay is refused, as every one after it until the token is back.
                future.set_exception(Pkcs11Unavailable(f"the PKCS#11 token cannot sign: {failure}"))
            except BaseException as exc:  # a bug: the caller gets it, the thread goes on
                future.set_exception(exc)
            else:
                with self._counted:
                    self.signatures += 1
                future.set_result(signature)
        self._drop(held)

    def _lose(self, reason: str) -> None:
        if self._down is None:
            self._down = reason
            self._wake.set()  # recovery starts now
            refused = "relays" if self.config.purpose == "relayer" else f"{self.config.purpose} calls"
            log.error(
                f"pkcs11 token unavailable: {refused} are refused",
                token=self.config.token_label,
                purpose=self.config.purpose,
                reason=reason,
            )

    def _watch(self) -> None:
        """Liveness while healthy (the keys still in the token), recovery once not."""
        from pkcs11.exceptions import PKCS11Error

        held: _Held | None = None
        while True:
            woken = self._wake.wait(LIVENESS_S if self._down is None else RECOVERY_S)
            self._wake.clear()
            if self._stopping.is_set():
                break
            if self._down is None and not woken:
                try:
                    with self.module.gate.call():
                        if held is None or held.generation != self.module.generation:
                            held = self._open_held()
                        else:
                            for ref in self.config.keys:
                                private_key(held.session, ref)
                except (PKCS11Error, SignerUnavailable) as exc:
                    self._lose(str(signer_failure(exc, "checking the keys")))
                    self._drop(held)
                    held = None
            elif self._down is not None and not self._pin_refused:
                self._drop(held)
                held = None
                self._recover()
        self._drop(held)

    def _recover(self) -> None:
        from pkcs11.exceptions import PKCS11Error

        for attempt in ("session", "module"):
            if attempt == "module" and not self.module.reinitialize():
                return
            try:
                keys = self._find(self.module, self.config)
            except Pkcs11Refused as exc:
                # A wrong PIN is never tried again: the token would lock it.
                self._pin_refused = isinstance(exc, Pkcs11PinRefused)
                self._down = str(exc)
                log.error(
                    "pkcs11 token refuses the signer",
                    token=self.config.token_label,
                    purpose=self.config.purpose,
                    reason=str(exc),
                )
                return
            except (PKCS11Error, SignerUnavailable) as exc:
                self._down = str(signer_failure(exc, "trying the token again"))
                continue
            if [key.pubkey for key in keys] != [key.pubkey for key in self.keys]:
                self._down = "the token holds other keys under the configured labels or ids"
                return
            self._down = None
            log.warning(
                "pkcs11 token available again",
                token=self.config.token_label,
                purpose=self.config.purpose,
                after=attempt,
            )
            return
