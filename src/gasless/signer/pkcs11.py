"""Relayer keys in a PKCS#11 token: Ed25519 keys (`CKK_EC_EDWARDS`) that sign inside the token (`CKM_EDDSA`)
and can never be read out of it (`CKA_SENSITIVE` true, `CKA_EXTRACTABLE` false). One code path for every
PKCS#11 module: SoftHSM, YubiHSM, CloudHSM, the PKCS#11 libraries of cloud KMSs (docs/keys.md).

Three layers:

- `_Module`: one loaded PKCS#11 library per process, shared by everything that uses it (refcounted). It is
  initialised with `CKF_OS_LOCKING_OK`: python-pkcs11 calls `C_Initialize` without arguments, which tells a
  module that no two threads will call it at once (SoftHSM then takes no locks at all) and which YubiHSM's
  module refuses. The module is logged in once per token (PKCS#11 logs in an application, not a session)
  through a session kept open for it; a module that disappeared is re-initialised (`C_Finalize`,
  `C_Initialize`) only once no call is under way.
- `Pkcs11Signer`: the `Signer`. Signatures are made by a small pool of threads, each with its own session
  (a PKCS#11 session is one caller at a time); the event loop only waits for them, so the relay's deadline
  (`sign_with_deadline`) applies as with PEM keys: a signature not back in time is discarded, and one still
  queued when its deadline passes is never made. Every signature is verified against the relayer's public
  key before it is returned: a signature is whole and valid, or the signer refuses.
- a watch thread per signer: every LIVENESS_S it checks that the keys are still in the token; once the token
  failed, `check()` and `sign()` refuse at once (`SIGNER_UNAVAILABLE`) and every RECOVERY_S it tries the
  token again (re-initialising the module when a session alone does not do), until every key signs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import queue
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.signer.base import RelayerKey, SignerUnavailable

if TYPE_CHECKING:
    from pkcs11 import Session, Token

    from gasless.settings import Settings

log = structlog.get_logger("gasless.signer")

# Ed25519's curve in CKA_EC_PARAMS: the DER OID 1.3.101.112 (RFC 8410), or the PrintableString
# "edwards25519" that PKCS#11 3.0 also allows (some modules take only one of the two).
ED25519_OID = bytes.fromhex("06032b6570")
ED25519_NAME = b"\x13\x0cedwards25519"
ED25519_PARAMS = (ED25519_OID, ED25519_NAME)

LIVENESS_S = 2.0  # how often a healthy signer checks that its keys are still in the token
RECOVERY_S = 1.0  # how often a signer whose token failed tries it again
REINIT_WAIT_S = 2.0  # how long a re-initialisation waits for the calls under way to end
STOP_WAIT_S = 5.0  # how long `close` waits for the signing threads

CKF_OS_LOCKING_OK = 0x2
CKR_OK = 0x0
CKR_CANT_LOCK = 0xA
CKR_CRYPTOKI_ALREADY_INITIALIZED = 0x191
_RV_NAMES = {
    0x5: "CKR_GENERAL_ERROR",
    0x6: "CKR_FUNCTION_FAILED",
    0x7: "CKR_ARGUMENTS_BAD",
    0xA: "CKR_CANT_LOCK",
    0x30: "CKR_DEVICE_ERROR",
    0x31: "CKR_DEVICE_MEMORY",
    0x32: "CKR_DEVICE_REMOVED",
    0xE0: "CKR_TOKEN_NOT_PRESENT",
    0x190: "CKR_CRYPTOKI_NOT_INITIALIZED",
}
# What the token answers when the PIN is wrong, locked or unusable: never tried again (a token locks its
# user PIN after a few wrong tries).
_PIN_ERRORS = (
    "PinIncorrect",
    "PinLocked",
    "PinExpired",
    "PinInvalid",
    "PinLenRange",
    "UserPinNotInitialized",
)


class Pkcs11Unavailable(SignerUnavailable):
    """The token cannot sign now (absent, unreachable, a key missing): tried again."""


class Pkcs11Refused(SignerUnavailable):
    """The token or its keys cannot be used as configured (a key that can be exported, a public key that
    does not match its private key, ...): the signer says so and does not start."""


class KeyTaken(Pkcs11Refused):
    """The token already holds another key under the label or id asked for."""


class Pkcs11PinRefused(Pkcs11Refused):
    """The token refused the PIN: never tried again (a token locks its user PIN after a few wrong tries)."""


# Configuration ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyRef:
    """Which key of the token: by `CKA_LABEL` (`label:NAME`, or just `NAME`) or by `CKA_ID` (`id:HEX`)."""

    label: str | None = None
    key_id: bytes | None = None

    @classmethod
    def parse(cls, text: str) -> KeyRef:
        text = text.strip()
        if text.startswith("id:"):
            digits = text[3:].strip().removeprefix("0x")
            if not digits or not re.fullmatch(r"(?:[0-9a-fA-F]{2})+", digits):
                raise ValueError(f"{text!r}: an id is written id:HEX (an even number of hex digits)")
            return cls(key_id=bytes.fromhex(digits))
        label = text.removeprefix("label:")
        if not label:
            raise ValueError(f"{text!r}: a key is written label:NAME or id:HEX")
        return cls(label=label)

    def attributes(self) -> dict[Any, Any]:
        from pkcs11 import Attribute

        return {Attribute.LABEL: self.label} if self.label is not None else {Attribute.ID: self.key_id}

    def __str__(self) -> str:
        return f"label:{self.label}" if self.label is not None else f"id:{(self.key_id or b'').hex()}"


@dataclass(frozen=True)
class Pkcs11Config:
    module: Path
    token_label: str
    pin: str = field(repr=False)
    keys: tuple[KeyRef, ...]
    sessions: int = 4

    @classmethod
    def from_settings(cls, settings: Settings) -> Pkcs11Config:
        """The signer's configuration; the PIN read from GASLESS_PKCS11_PIN or the file it names
        (Pkcs11Refused when the file cannot be read)."""
        assert settings.pkcs11_module is not None and settings.pkcs11_token_label is not None
        return cls(
            module=settings.pkcs11_module,
            token_label=settings.pkcs11_token_label,
            pin=read_pin(
                settings.pkcs11_pin.get_secret_value() if settings.pkcs11_pin is not None else None,
                settings.pkcs11_pin_file,
            ),
            keys=tuple(KeyRef.parse(ref) for ref in settings.pkcs11_relayer_keys),
            sessions=settings.pkcs11_sessions,
        )


def read_pin(pin: str | None, pin_file: Path | None) -> str:
    """The token's user PIN: given, or the first line of `pin_file` (its line end dropped)."""
    if pin is not None:
        return pin
    if pin_file is None:
        raise Pkcs11Refused("no PIN: set GASLESS_PKCS11_PIN or GASLESS_PKCS11_PIN_FILE")
    try:
        text = Path(pin_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise Pkcs11Refused(f"the PIN file {pin_file} cannot be read ({reason})") from None
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise Pkcs11Refused(f"the PIN file {pin_file} is empty")
    return lines[0]


# The module -------------------------------------------------------------------------------------------
class _InitArgs(ctypes.Structure):
    _fields_ = [
        ("CreateMutex", ctypes.c_void_p),
        ("DestroyMutex", ctypes.c_void_p),
        ("LockMutex", ctypes.c_void_p),
        ("UnlockMutex", ctypes.c_void_p),
        ("flags", ctypes.c_ulong),
        ("pReserved", ctypes.c_void_p),
    ]


class _FunctionListHead(ctypes.Structure):
    """The start of CK_FUNCTION_LIST: the version, then C_Initialize and C_Finalize."""

    _fields_ = [
        ("major", ctypes.c_ubyte),
        ("minor", ctypes.c_ubyte),
        ("C_Initialize", ctypes.c_void_p),
        ("C_Finalize", ctypes.c_void_p),
    ]


_RV_FUNCTION = ctypes.CFUNCTYPE(ctypes.c_ulong, ctypes.c_void_p)


def _rv_name(rv: int) -> str:
    return _RV_NAMES.get(rv, f"0x{rv:x}")


class _Cryptoki:
    """C_Initialize and C_Finalize of a module, through its function list."""

    def __init__(self, path: str) -> None:
        try:
            self._dll = ctypes.CDLL(path)
            get_list = self._dll.C_GetFunctionList
        except (OSError, AttributeError) as exc:
            raise Pkcs11Refused(f"the PKCS#11 module {path} cannot be loaded ({exc})") from None
        get_list.restype = ctypes.c_ulong
        get_list.argtypes = [ctypes.POINTER(ctypes.POINTER(_FunctionListHead))]
        head = ctypes.POINTER(_FunctionListHead)()
        rv = get_list(ctypes.byref(head))
        if rv != CKR_OK or not head:
            raise Pkcs11Refused(f"the PKCS#11 module {path}: C_GetFunctionList returned {_rv_name(rv)}")
        self._initialize = _RV_FUNCTION(head.contents.C_Initialize)
        self._finalize = _RV_FUNCTION(head.contents.C_Finalize)

    def initialize(self, threads: bool) -> int:
        if not threads:
            return int(self._initialize(None))
        args = _InitArgs(None, None, None, None, CKF_OS_LOCKING_OK, None)
        return int(self._initialize(ctypes.addressof(args)))

    def finalize(self) -> int:
        return int(self._finalize(None))


class _Gate:
    """Calls into a module share it; its re-initialisation takes it alone, once no call is under way (a
    call into a finalised module is undefined). `serial`: a module that cannot lock for threads gets one
    call at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._alone = False
        self._serial = threading.Lock()
        self.serial = False

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._alone)
            self._calls += 1
        try:
            if self.serial:
                with self._serial:
                    yield
            else:
                yield
        finally:
            with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, timeout: float) -> Iterator[bool]:
        """True once every call ended (no new one starts meanwhile); False after `timeout` (a call hangs)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._alone)
            self._alone = True
            if not self._cond.wait_for(lambda: self._calls == 0, timeout):
                self._alone = False
                self._cond.notify_all()
                alone = False
            else:
                alone = True
        try:
            yield alone
        finally:
            if alone:
                with self._cond:
                    self._alone = False
                    self._cond.notify_all()


@dataclass
class _Login:
    pin: str = field(repr=False)
    refs: int = 0
    session: Session | None = None
    generation: int = -1


class _Module:
    """One PKCS#11 library of the process (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cryptoki = _Cryptoki(path)
        self.lib: Any = None
        self.gate = _Gate()
        self.generation = 0
        self.initialized = False
        self.owned = True  # False: something else in the process initialised it, not ours to reset
        self.refs = 0
        self._lock = threading.RLock()
        self._logins: dict[str, _Login] = {}
        self._tokens: dict[str, tuple[int, Token]] = {}

    def start(self) -> None:
        rv = self.cryptoki.initialize(threads=True)
        if rv == CKR_CANT_LOCK:  # the module cannot lock for threads: one call at a time (the gate's)
            self.gate.serial = True
            rv = self.cryptoki.initialize(threads=False)
        if rv == CKR_CRYPTOKI_ALREADY_INITIALIZED:
            self.owned, rv = False, CKR_OK
        if rv != CKR_OK:
            raise Pkcs11Unavailable(f"the PKCS#11 module cannot start: C_Initialize returned {_rv_name(rv)}")
        self.initialized = True
        if self.lib is None:
            self.lib = _library_class()(self.path)

    def stop(self, finalize: bool) -> None:
        with self._lock:
            self._tokens.clear()
            if finalize and self.owned and self.initialized:
                self.cryptoki.finalize()
            self.initialized = False

    def reinitialize(self) -> bool:
        """C_Finalize and C_Initialize (a token that disappeared and came back, a module that lost its
        device); False when a call is still under way after REINIT_WAIT_S or the module does not start."""
        if not self.owned:
            return False
        with self.gate.alone(REINIT_WAIT_S) as alone, self._lock:
            if not alone:
                return False
            if self.initialized:
                self.cryptoki.finalize()
            self.initialized = False
            self.generation += 1  # every session of the old one is gone: never closed, never used again
            self._tokens.clear()
            for login in self._logins.values():
                login.session = None
            rv = self.cryptoki.initialize(threads=not self.gate.serial)
            if rv != CKR_OK:
                log.warning("pkcs11 module did not start again", rv=_rv_name(rv), module=self.path)
                return False
            self.initialized = True
            return True

    def token(self, label: str) -> Token:
        """The token labelled `label` (Pkcs11Unavailable when no token or several have that label)."""
        from pkcs11.exceptions import MultipleTokensReturned, NoSuchToken

        with self._lock:
            cached = self._tokens.get(label)
            if cached is not None and cached[0] == self.generation:
                return cached[1]
            try:
                token = self.lib.get_token(token_label=label)
            except NoSuchToken:
                raise Pkcs11Unavailable(f"no token labelled {label!r} in the PKCS#11 module") from None
            except MultipleTokensReturned:
                raise Pkcs11Refused(f"several tokens are labelled {label!r}") from None
            self._tokens[label] = (self.generation, token)
            return token

    def login(self, label: str, pin: str) -> None:
        """Log the process in to the token (once, whoever asks; `logout` as many times). Never called
        under the gate: the gate's calls do not nest (a re-initialisation waiting would wait for ever)."""
        with self.gate.call(), self._lock:
            login = self._logins.get(label)
            if login is None:
                login = self._logins[label] = _Login(pin)
            login.refs += 1
            try:
                self._ensure_login(label, login)
            except BaseException:
                login.refs -= 1
                if login.refs == 0:
                    del self._logins[label]
                raise

    def ensure_login(self, label: str) -> None:
        """Log in again after a re-initialisation (a new module state has nobody logged in); under the
        gate."""
        with self._lock:
            login = self._logins.get(label)
            if login is not None:
                self._ensure_login(label, login)

    def _ensure_login(self, label: str, login: _Login) -> None:
        from pkcs11.exceptions import PKCS11Error, UserAlreadyLoggedIn

        if login.session is not None and login.generation == self.generation:
            return
        token = self.token(label)
        try:
            session = token.open(user_pin=login.pin)
        except UserAlreadyLoggedIn:  # something else in the process logged in: a plain session holds it
            session = token.open()
        except PKCS11Error as exc:
            raise _failure(exc, f"logging in to the token {label!r}") from None
        login.session, login.generation = session, self.generation

    def logout(self, label: str) -> None:
        with self.gate.call(), self._lock:
            login = self._logins.get(label)
            if login is None:
                return
            login.refs -= 1
            if login.refs > 0:
                return
            del self._logins[label]
            if login.session is not None and login.generation == self.generation:
                with contextlib.suppress(Exception):
                    login.session.close()  # C_Logout, C_CloseSession


_MODULES: dict[str, _Module] = {}
_MODULES_LOCK = threading.Lock()


def _library_class() -> type:
    """python-pkcs11's library object, its C_Initialize (without arguments) left to `_Module.start`."""
    from pkcs11 import _pkcs11

    class _Library(_pkcs11.lib):  # type: ignore[misc,name-defined]
        def initialize(self) -> None:
            pass

    return _Library


def _acquire(path: Path) -> _Module:
    key = str(Path(path).resolve())
    with _MODULES_LOCK:
        module = _MODULES.get(key)
        if module is None:
            module = _Module(key)
            module.start()
            _MODULES[key] = module
        module.refs += 1
        return module


def _release(module: _Module, *, finalize: bool = True) -> None:
    with _MODULES_LOCK:
        module.refs -= 1
        if module.refs > 0:
            return
        _MODULES.pop(module.path, None)
        module.stop(finalize)


def _failure(exc: BaseException, doing: str) -> SignerUnavailable:
    """A PKCS#11 error as the signer's: Pkcs11Refused for a PIN the token refuses, else Pkcs11Unavailable."""
    name = type(exc).__name__
    if isinstance(exc, SignerUnavailable):
        return exc
    if name in _PIN_ERRORS:
        return Pkcs11PinRefused(f"{doing}: the token refused the PIN ({name})")
    return Pkcs11Unavailable(f"{doing}: {name}")


@contextlib.contextmanager
def token_session(module_path: Path, token_label: str, pin: str, *, rw: bool = False) -> Iterator[Session]:
    """A logged-in session on the token (the CLI's and the tests' way in); closed, and the module released,
    on the way out."""
    from pkcs11.exceptions import PKCS11Error

    module = _acquire(module_path)
    try:
        module.login(token_label, pin)
        try:
            with module.gate.call():
                try:
                    session = module.token(token_label).open(rw=rw)
                except PKCS11Error as exc:
                    raise _failure(exc, f"opening a session on the token {token_label!r}") from None
                try:
                    yield session
                finally:
                    with contextlib.suppress(PKCS11Error):
                        session.close()
        finally:
            module.logout(token_label)
    finally:
        _release(module)


# Keys -------------------------------------------------------------------------------------------------
def public_key_bytes(point: bytes) -> bytes:
    """An Ed25519 CKA_EC_POINT: the DER OCTET STRING of the 32-byte key (SoftHSM, most modules), or the 32
    bytes themselves (as PKCS#11 3.0 words it)."""
    if len(point) == 34 and point[:2] == b"\x04\x20":
        return point[2:]
    if len(point) == 32:
        return point
    raise ValueError(f"not an Ed25519 public key ({len(point)} bytes)")


@dataclass(frozen=True)
class TokenKey:
    """An Ed25519 key pair found in a token."""

    label: str
    key_id: bytes
    pubkey: bytes
    sensitive: bool
    extractable: bool

    @property
    def address(self) -> str:
        return address_of(self.pubkey).to_bech32()

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.pubkey)


def _objects(session: Session, object_class: Any, ref: KeyRef) -> list[Any]:
    from pkcs11 import Attribute

    return list(session.get_objects({Attribute.CLASS: object_class, **ref.attributes()}))


def _private_key(session: Session, ref: KeyRef) -> Any:
    from pkcs11 import ObjectClass

    found = _objects(session, ObjectClass.PRIVATE_KEY, ref)
    if not found:
        raise Pkcs11Unavailable(f"no private key {ref} in the token")
    if len(found) > 1:
        raise Pkcs11Refused(f"{len(found)} private keys match {ref}: name one key")
    return found[0]


def _key_pair(session: Session, ref: KeyRef) -> tuple[Any, TokenKey]:
    """The private key object of `ref` and what is known of its pair; Pkcs11Refused for a key that is not
    an Ed25519 signing key held sensitive and unextractable, or a pair that does not match."""
    from pkcs11 import Attribute, KeyType, ObjectClass

    private = _private_key(session, ref)
    if private[Attribute.KEY_TYPE] != KeyType.EC_EDWARDS:
        raise Pkcs11Refused(f"{ref} is not an Ed25519 key (CKK_EC_EDWARDS)")
    sensitive, extractable = bool(private[Attribute.SENSITIVE]), bool(private[Attribute.EXTRACTABLE])
    if not sensitive or extractable:
        raise Pkcs11Refused(
            f"{ref} can be read out of the token (CKA_SENSITIVE {sensitive}, CKA_EXTRACTABLE {extractable}): "
            "a relayer key must be sensitive and not extractable"
        )
    if not private[Attribute.SIGN]:
        raise Pkcs11Refused(f"{ref} may not sign (CKA_SIGN false)")
    publics = _objects(session, ObjectClass.PUBLIC_KEY, ref)
    if len(publics) != 1:
        raise Pkcs11Refused(f"{len(publics)} public keys match {ref}: the token must hold exactly one")
    try:
        pubkey = public_key_bytes(bytes(publics[0][Attribute.EC_POINT]))
    except ValueError as exc:
        raise Pkcs11Refused(f"{ref}: {exc}") from None
    key = TokenKey(
        label=str(private[Attribute.LABEL]),
        key_id=bytes(private[Attribute.ID]),
        pubkey=pubkey,
        sensitive=sensitive,
        extractable=extractable,
    )
    _prove(private, pubkey, ref)
    return private, key


def _prove(private: Any, pubkey: bytes, ref: KeyRef | str) -> None:
    """One signature by `private`, verified with `pubkey`: the token signs, with the key it says it has."""
    from pkcs11 import Mechanism

    message = b"gasless pkcs11 key check " + os.urandom(16)
    signature = bytes(private.sign(message, mechanism=Mechanism.EDDSA))
    try:
        VerifyKey(pubkey).verify(message, signature)
    except (BadSignatureError, ValueError):
        raise Pkcs11Refused(f"{ref}: its signature does not verify with its public key") from None


def list_keys(session: Session) -> list[TokenKey]:
    """Every Ed25519 key pair of the token (private key objects with a public key of the same id)."""
    from pkcs11 import Attribute, KeyType, ObjectClass

    keys = []
    # Read whole first: a session runs one search at a time.
    privates = list(
        session.get_objects(
            {Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.KEY_TYPE: KeyType.EC_EDWARDS}
        )
    )
    for private in privates:
        key_id, label = bytes(private[Attribute.ID]), str(private[Attribute.LABEL])
        ref = KeyRef(key_id=key_id) if key_id else KeyRef(label=label)
        publics = _objects(session, ObjectClass.PUBLIC_KEY, ref)
        if len(publics) != 1:
            continue
        try:
            pubkey = public_key_bytes(bytes(publics[0][Attribute.EC_POINT]))
        except ValueError:
            continue
        keys.append(
            TokenKey(
                label=label,
                key_id=key_id,
                pubkey=pubkey,
                sensitive=bool(private[Attribute.SENSITIVE]),
                extractable=bool(private[Attribute.EXTRACTABLE]),
            )
        )
    return sorted(keys, key=lambda key: (key.shard, key.label))


@dataclass(frozen=True)
class Imported:
    key: TokenKey
    created: bool  # False: the token already held this very key under that label and id


def key_taken(session: Session, label: str, key_id: bytes) -> bool:
    """The token holds a key object (private or public) labelled `label` or with the id `key_id`."""
    from pkcs11 import ObjectClass

    return any(
        _objects(session, cls, ref)
        for ref in (KeyRef(label=label), KeyRef(key_id=key_id))
        for cls in (ObjectClass.PRIVATE_KEY, ObjectClass.PUBLIC_KEY)
    )


def import_key(session: Session, secret: bytes, *, label: str, key_id: bytes) -> Imported:
    """Create the Ed25519 key pair of `secret` (a 32-byte seed) in the token: the private key sensitive,
    not extractable and only for signing, the public key beside it, both under `label` and `key_id`.
    The token's signature is checked before it counts (else both objects are destroyed). Pkcs11Refused when
    the token already holds another key under that label or id."""
    from pkcs11 import Attribute, KeyType, ObjectClass
    from pkcs11.exceptions import AttributeValueInvalid, PKCS11Error, TemplateInconsistent

    pubkey = bytes(SigningKey(secret).verify_key)
    if key_taken(session, label, key_id):
        try:
            _, key = _key_pair(session, KeyRef(key_id=key_id))
        except SignerUnavailable:
            key = None
        if key is not None and key.pubkey == pubkey and key.label == label:
            return Imported(key, created=False)
        raise KeyTaken(
            f"the token already holds another key labelled {label!r} or with id {key_id.hex()}: choose "
            "another --label and --id"
        )
    common = {
        Attribute.KEY_TYPE: KeyType.EC_EDWARDS,
        Attribute.TOKEN: True,
        Attribute.LABEL: label,
        Attribute.ID: key_id,
    }
    created: list[Any] = []
    try:
        for params in ED25519_PARAMS:
            try:
                private = session.create_object(
                    {
                        **common,
                        Attribute.CLASS: ObjectClass.PRIVATE_KEY,
                        Attribute.EC_PARAMS: params,
                        Attribute.VALUE: secret,
                        Attribute.PRIVATE: True,
                        Attribute.SENSITIVE: True,
                        Attribute.EXTRACTABLE: False,
                        Attribute.SIGN: True,
                        Attribute.DECRYPT: False,
                        Attribute.UNWRAP: False,
                        Attribute.DERIVE: False,
                    }
                )
                break
            except (AttributeValueInvalid, TemplateInconsistent):
                if params is ED25519_PARAMS[-1]:
                    raise
        created.append(private)
        created.append(
            session.create_object(
                {
                    **common,
                    Attribute.CLASS: ObjectClass.PUBLIC_KEY,
                    Attribute.EC_PARAMS: params,
                    Attribute.EC_POINT: b"\x04\x20" + pubkey,
                    Attribute.PRIVATE: False,
                    Attribute.VERIFY: True,
                }
            )
        )
        _, key = _key_pair(session, KeyRef(key_id=key_id))
        if key.pubkey != pubkey:
            raise Pkcs11Refused("the token holds another public key than the one imported")
    except BaseException as exc:
        for obj in created:
            with contextlib.suppress(PKCS11Error):
                obj.destroy()
        if isinstance(exc, PKCS11Error):
            raise _failure(exc, "creating the key in the token") from None
        raise
    return Imported(key, created=True)


def generate_key(session: Session, *, shard: int, label: str, key_id: bytes, attempts: int = 64) -> TokenKey:
    """A new Ed25519 key pair generated inside the token (its private key never existed outside it), whose
    address is in `shard`: pairs in other shards are destroyed and generated again."""
    from pkcs11 import Attribute, KeyType, Mechanism
    from pkcs11.exceptions import AttributeValueInvalid, PKCS11Error, TemplateInconsistent

    private_template = {
        Attribute.PRIVATE: True,
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        Attribute.SIGN: True,
        Attribute.DECRYPT: False,
        Attribute.UNWRAP: False,
        Attribute.DERIVE: False,
    }
    public_template = {Attribute.PRIVATE: False, Attribute.VERIFY: True}
    try:
        for _ in range(attempts):
            for params in ED25519_PARAMS:
                try:
                    public, private = session.create_domain_parameters(
                        KeyType.EC_EDWARDS, {Attribute.EC_PARAMS: params}, local=True
                    ).generate_keypair(
                        mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN,
                        store=True,
                        label=label,
                        id=key_id,
                        public_template=public_template,
                        private_template=private_template,
                    )
                    break
                except (AttributeValueInvalid, TemplateInconsistent):
                    if params is ED25519_PARAMS[-1]:
                        raise
            pubkey = public_key_bytes(bytes(public[Attribute.EC_POINT]))
            if shard_of_pubkey(pubkey) == shard:
                _, key = _key_pair(session, KeyRef(key_id=key_id))
                return key
            private.destroy()
            public.destroy()
    except PKCS11Error as exc:
        raise _failure(exc, "generating a key in the token") from None
    raise Pkcs11Unavailable(f"no key in shard {shard} after {attempts} key pairs")


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

    def __init__(self, config: Pkcs11Config, module: _Module, keys: Sequence[TokenKey]) -> None:
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
        module = _acquire(config.module)
        try:
            module.login(config.token_label, config.pin)
            try:
                keys = cls._find(module, config)
            except BaseException:
                module.logout(config.token_label)
                raise
        except BaseException:
            _release(module)
            raise
        signer = cls(config, module, keys)
        for thread in signer._threads:
            thread.start()
        log.info(
            "pkcs11 signer ready",
            token=config.token_label,
            relayers=[key.address for key in keys],
            sessions=config.sessions,
        )
        return signer

    @staticmethod
    def _find(module: _Module, config: Pkcs11Config) -> list[TokenKey]:
        from pkcs11.exceptions import PKCS11Error

        with module.gate.call():
            try:
                module.ensure_login(config.token_label)
                session = module.token(config.token_label).open()
            except PKCS11Error as exc:
                raise _failure(exc, f"opening a session on the token {config.token_label!r}") from None
            try:
                keys = [_key_pair(session, ref)[1] for ref in config.keys]
            except PKCS11Error as exc:
                raise _failure(exc, "reading the relayer keys") from None
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
        _release(self.module, finalize=not hung)

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
            raise _failure(exc, "opening a session") from None
        try:
            keys = [_private_key(session, ref) for ref in self.config.keys]
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
                    failure = _failure(exc, "signing")
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
            log.error(
                "pkcs11 token unavailable: relays are refused", token=self.config.token_label, reason=reason
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
                                _private_key(held.session, ref)
                except (PKCS11Error, SignerUnavailable) as exc:
                    self._lose(str(_failure(exc, "checking the keys")))
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
                log.error("pkcs11 token refuses the signer", token=self.config.token_label, reason=str(exc))
                return
            except (PKCS11Error, SignerUnavailable) as exc:
                self._down = str(_failure(exc, "trying the token again"))
                continue
            if [key.pubkey for key in keys] != [key.pubkey for key in self.keys]:
                self._down = "the token holds other keys under the configured labels or ids"
                return
            self._down = None
            log.warning("pkcs11 token available again", token=self.config.token_label, after=attempt)
            return
