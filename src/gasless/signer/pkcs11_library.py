"""The PKCS#11 library of the process and the way into a token: one loaded module per library file, shared
by every signer and command that uses it (refcounted), its login, sessions, and the errors the signer
reports (docs/keys.md).

A module is initialised with `CKF_OS_LOCKING_OK`: python-pkcs11 calls `C_Initialize` without arguments,
which tells a module that no two threads will call it at once (SoftHSM then takes no locks at all) and
which YubiHSM's module refuses. The module is logged in once per token (PKCS#11 logs in an application, not
a session) through a session kept open for it; a module that disappeared is re-initialised (`C_Finalize`,
`C_Initialize`) only once no call is under way (`_Gate`).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from gasless.signer.base import SignerUnavailable

if TYPE_CHECKING:
    from pkcs11 import Session, Token

log = structlog.get_logger("gasless.signer")

REINIT_WAIT_S = 2.0  # how long a re-initialisation waits for the calls under way to end

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


class Pkcs11PinRefused(Pkcs11Refused):
    """The token refused the PIN: never tried again (a token locks its user PIN after a few wrong tries)."""


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


class Pkcs11Module:
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
            raise signer_failure(exc, f"logging in to the token {label!r}") from None
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


_MODULES: dict[str, Pkcs11Module] = {}
_MODULES_LOCK = threading.Lock()


def _library_class() -> type:
    """python-pkcs11's library object, its C_Initialize (without arguments) left to `Pkcs11Module.start`."""
    from pkcs11 import _pkcs11

    class _Library(_pkcs11.lib):  # type: ignore[misc,name-defined]
        def initialize(self) -> None:
            pass

    return _Library


def acquire_module(path: Path) -> Pkcs11Module:
    key = str(Path(path).resolve())
    with _MODULES_LOCK:
        module = _MODULES.get(key)
        if module is None:
            module = Pkcs11Module(key)
            module.start()
            _MODULES[key] = module
        module.refs += 1
        return module


def release_module(module: Pkcs11Module, *, finalize: bool = True) -> None:
    with _MODULES_LOCK:
        module.refs -= 1
        if module.refs > 0:
            return
        _MODULES.pop(module.path, None)
        module.stop(finalize)


def signer_failure(exc: BaseException, doing: str) -> SignerUnavailable:
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

    module = acquire_module(module_path)
    try:
        module.login(token_label, pin)
        try:
            with module.gate.call():
                try:
                    session = module.token(token_label).open(rw=rw)
                except PKCS11Error as exc:
                    raise signer_failure(exc, f"opening a session on the token {token_label!r}") from None
                try:
                    yield session
                finally:
                    with contextlib.suppress(PKCS11Error):
                        session.close()
        finally:
            module.logout(token_label)
    finally:
        release_module(module)
