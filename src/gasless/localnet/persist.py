"""localnet's chain on disk, so that a stopped network resumes where it stopped.

Under `<data-dir>/localnet/chain/`:

- `history.bin`, append-only: frames, each holding the hyperblocks (with their shard blocks) produced since
  the previous snapshot, the transaction records settled since then (notarized at destination, or
  displaced from the pool) and the submission counts that changed since then (a later frame's count of a
  hash replaces an earlier one's). None of these changes once written, so a snapshot writes only what is
  new, and its cost does not grow with the number of transactions ever sent.
- `head.bin`, replaced whole at each snapshot: everything else (accounts with balances, nonces, ESDT,
  guardians, contracts and their state; the pool and the records still pending; the round clock; the chain
  faults; the genesis facts) and how many bytes of `history.bin` it covers.
- `lock`: held (`flock`) by the process running the chain, so two processes never write one chain.

A snapshot is taken on the event loop, where the chain changes (so it is consistent): the head is
serialized there. A thread serializes the new history (which never changes again) and writes: the history
frame is appended and fsynced, then the head goes to a temporary file that is fsynced and renamed over the
old head, and the directory is fsynced. A crash at any point leaves a complete older
head, which ignores any history bytes past the length it names (the next write cuts them off).

Format: each file starts with the line `gasless-localnet-chain <format> <gasless version> <shape>`; the
body is pickle (protocol 5). Transactions are kept in the gateway's JSON form and hyperblocks already held
by an earlier frame as references, so the files name only the classes of `SAVED_CLASSES` and a few standard
types; the loader accepts nothing else. `shape` is a digest of those classes' fields: a class that changes
shape makes the files of earlier versions another format. A file of another format or shape is refused
with a message that says what to do.
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import hashlib
import io
import os
import pickle
import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from itertools import islice
from pathlib import Path
from typing import IO, Any

from multiversx_sdk import Transaction

from gasless import __version__
from gasless.chain.codec import tx_from_wire
from gasless.chain.gas import GasRules
from gasless.localnet.chain import Block, BlockRef, ChainConfig, HyperBlock, LocalChain, TxRecord
from gasless.localnet.contracts import billing_state
from gasless.localnet.contracts.billing import BillingContract
from gasless.localnet.contracts.venue import PairContract, PairState, WrapperContract, WrapperState
from gasless.localnet.processing import Outcome
from gasless.localnet.state import Account, Guardian
from gasless.localnet.vm import LogEvent

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock, the data directory is the user's to share
    fcntl = None  # type: ignore[assignment]

# The layout of the files (2: shard blocks waiting for notarization; 3: submission counts in the history's
# frames, not the head); their content's shape is SHAPE.
FORMAT = 3
MAGIC = b"gasless-localnet-chain"
FRAME = struct.Struct(">QI")  # payload length, CRC-32 of the payload
PROTOCOL = 5

# Every class a saved chain holds, besides a few standard types. A class missing here cannot be loaded (the
# resume tests fail), and their fields make SHAPE.
SAVED_CLASSES: tuple[type, ...] = (
    ChainConfig,
    GasRules,
    Block,
    BlockRef,
    HyperBlock,
    TxRecord,
    Outcome,
    LogEvent,
    Account,
    Guardian,
    BillingContract,
    billing_state.BillingState,
    billing_state.BillingConfig,
    billing_state.PendingFee,
    billing_state.PauseState,
    billing_state.Tier,
    billing_state.RateClass,
    billing_state.TariffEntry,
    billing_state.RelayerInfo,
    billing_state.PlanBlock,
    billing_state.PaygSettings,
    billing_state.AccountState,
    billing_state.Settlement,
    PairContract,
    PairState,
    WrapperContract,
    WrapperState,
)
_SAVED = {(cls.__module__, cls.__qualname__): cls for cls in SAVED_CLASSES}


def _shape_of(cls: type) -> str:
    if dataclasses.is_dataclass(cls):
        members = ",".join(f"{f.name}:{f.type}" for f in dataclasses.fields(cls))
    else:  # a contract model: its fields are its state (a dataclass above) and its ABI file
        members = f"state,abi:{cls.abi_file.name}"  # type: ignore[attr-defined]
    return f"{cls.__module__}.{cls.__qualname__}({members})"


SHAPE = hashlib.sha256("\n".join(map(_shape_of, SAVED_CLASSES)).encode()).hexdigest()[:16]

# The standard types a saved chain may name.
_STANDARD = {
    "builtins": {"bytes", "bytearray", "complex", "dict", "frozenset", "list", "set", "tuple"},
    "collections": {"Counter", "OrderedDict", "defaultdict", "deque"},
    "decimal": {"Decimal"},
}


class SavedChainError(RuntimeError):
    """The saved chain cannot be used as asked; the message says why and what to do."""


def _header() -> bytes:
    return f"{MAGIC.decode()} {FORMAT} {__version__} {SHAPE}\n".encode()


def _check_header(path: Path, line: bytes) -> None:
    parts = line.decode(errors="replace").split()
    if len(parts) < 3 or parts[0] != MAGIC.decode():
        raise SavedChainError(
            f"{path} is not a saved localnet chain: move it away, or start over with --fresh"
        )
    found, writer, shape = parts[1], parts[2], parts[3] if len(parts) > 3 else "-"
    if (found, shape) != (str(FORMAT), SHAPE):
        raise SavedChainError(
            f"the chain saved in {path.parent} has format {found}/{shape} (written by gasless {writer}), and "
            f"this gasless {__version__} reads format {FORMAT}/{SHAPE}: start a new chain with --fresh, or "
            f"run gasless {writer} to keep this one"
        )


# References resolved by the loader ------------------------------------------------------------------------
def _hyperblock(nonce: int) -> HyperBlock:
    """A hyperblock an earlier frame holds; only the loader resolves it (see `_Unpickler.find_class`)."""
    raise SavedChainError(f"hyperblock {nonce} referenced outside a chain load")


def _transaction(wire: dict[str, Any]) -> Transaction:
    return tx_from_wire(wire)


def _reduce_transaction(tx: Transaction) -> tuple[Any, ...]:
    return _transaction, (tx.to_dictionary(),)


class _Pickler(pickle.Pickler):
    """Hyperblocks below `first_new` are written as references; transactions in their JSON form."""

    def __init__(self, file: IO[bytes], first_new: int) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self.first_new = first_new
        self.dispatch_table = {
            **copyreg.dispatch_table,
            HyperBlock: self._reduce_hyperblock,
            Transaction: _reduce_transaction,
        }

    def _reduce_hyperblock(self, hyper: HyperBlock) -> Any:
        if hyper.nonce < self.first_new:
            return _hyperblock, (hyper.nonce,)
        return hyper.__reduce_ex__(PROTOCOL)


def _dumps(obj: Any, first_new: int) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, first_new).dump(obj)
    return buffer.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], hyperblocks: list[HyperBlock]) -> None:
        super().__init__(file)
        self.hyperblocks = hyperblocks

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_hyperblock":
            return self.hyperblocks.__getitem__
        if module == __name__ and name == "_transaction":
            return _transaction
        if name in _STANDARD.get(module, ()):
            return super().find_class(module, name)
        if (module, name) in _SAVED:
            return _SAVED[module, name]
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a saved chain")


# The store ------------------------------------------------------------------------------------------------
@dataclass
class _Written:
    """How far the files on disk go."""

    history_length: int = 0  # bytes of history.bin the head covers (0: no history file yet)
    hyperblocks: int = 0  # hyperblocks held by history.bin
    records: int = 0  # chain.records entries seen; the settled ones are in history.bin
    unsettled: list[TxRecord] = field(default_factory=list)  # seen, not settled: in the head
    # Submission counts taken from the chain and not yet in history.bin (a failed write keeps them).
    submissions: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One snapshot taken on the loop: the head's body serialized, and the new history, which never changes
    again and is serialized by the writer thread (off the loop)."""

    hyperblocks: list[HyperBlock]  # produced since the last snapshot
    settled: list[TxRecord]  # settled since the last snapshot
    submissions: dict[str, int]  # the counts changed since the last written snapshot
    first_new: int  # nonce of the first of `hyperblocks`
    body: bytes
    after: _Written  # where the files stand once written (but the history length, known once written)


@dataclass
class SavedChain:
    chain: LocalChain
    genesis: dict[str, Any]  # the genesis facts the chain was created with (`genesis.genesis_facts`)


class ChainStore:
    """The saved chain of one data directory: lock, load, take snapshots, write them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.head_path = directory / "head.bin"
        self.history_path = directory / "history.bin"
        self._written = _Written()
        self._lock: IO[bytes] | None = None

    # Lock -------------------------------------------------------------------------------------------------
    def lock(self) -> None:
        """Claim the directory for this process (SavedChainError if another process runs this chain)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = (self.directory / "lock").open("a+b")
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                raise SavedChainError(
                    f"another localnet is running the chain in {self.directory}: stop it first, or use "
                    "another --data-dir"
                ) from None
        self._lock = handle

    def unlock(self) -> None:
        handle, self._lock = self._lock, None
        if handle is not None:
            handle.close()  # closing releases the flock

    def clear(self) -> None:
        """Forget the saved chain (--fresh); the next snapshot starts new files."""
        for path in (self.head_path, self.history_path, self._temporary):
            path.unlink(missing_ok=True)
        self._written = _Written()

    @property
    def _temporary(self) -> Path:
        return self.head_path.with_name(self.head_path.name + ".tmp")

    # Load -------------------------------------------------------------------------------------------------
    def load(self) -> SavedChain | None:
        """The saved chain, or None when there is none; SavedChainError when it cannot be read."""
        if not self.head_path.exists():
            return None
        try:
            with self.head_path.open("rb") as head:
                _check_header(self.head_path, head.readline())
                index = _Unpickler(head, []).load()
                hyperblocks, settled, submissions = self._read_history(int(index["historyLength"]))
                body = _Unpickler(head, hyperblocks).load()
            chain = self._rebuild(body, hyperblocks, settled)
            chain.submissions = submissions
        except SavedChainError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoding failure means the same thing to the user
            raise SavedChainError(
                f"cannot read the chain saved in {self.directory} ({type(exc).__name__}: {exc}): start a new "
                "chain with --fresh"
            ) from exc
        if len(chain.hyperblocks) != index["hyperblocks"] or len(chain.records) != index["records"]:
            raise SavedChainError(
                f"the chain saved in {self.directory} is incomplete (history and head disagree): start a new "
                "chain with --fresh"
            )
        self._written = _Written(
            history_length=int(index["historyLength"]),
            hyperblocks=len(chain.hyperblocks),
            records=len(chain.records),
            unsettled=list(body["unsettled"]),
        )
        return SavedChain(chain, body["genesis"])

    def _read_history(self, length: int) -> tuple[list[HyperBlock], list[TxRecord], Counter[str]]:
        hyperblocks: list[HyperBlock] = []
        settled: list[TxRecord] = []
        submissions: Counter[str] = Counter()
        with self.history_path.open("rb") as history:
            _check_header(self.history_path, history.readline())
            position = history.tell()
            while position < length:
                size, crc = FRAME.unpack(history.read(FRAME.size))
                payload = history.read(size)
                if len(payload) != size or zlib.crc32(payload) != crc:
                    raise SavedChainError(
                        f"the chain history in {self.history_path} is damaged at byte {position}: start a "
                        "new chain with --fresh"
                    )
                new_hyperblocks, new_settled, counts = _Unpickler(io.BytesIO(payload), hyperblocks).load()
                hyperblocks.extend(new_hyperblocks)
                settled.extend(new_settled)
                dict.update(submissions, counts)  # the later count replaces the earlier (Counter's adds)
                position += FRAME.size + size
        if position != length:
            raise SavedChainError(
                f"the chain history in {self.history_path} is shorter than its head says: start a new chain "
                "with --fresh"
            )
        return hyperblocks, settled, submissions

    @staticmethod
    def _rebuild(body: dict[str, Any], hyperblocks: list[HyperBlock], settled: list[TxRecord]) -> LocalChain:
        chain = LocalChain(body["config"], genesis_ms=body["genesisMs"])
        chain.load_history(hyperblocks)
        chain.round = body["round"]
        chain.world.accounts = body["accounts"]
        chain.records = {record.hash: record for record in settled}
        chain.records.update((record.hash, record) for record in body["unsettled"])
        chain.pool = body["pool"]
        chain.pool_senders = body["poolSenders"]
        chain.incoming = body["incoming"]
        chain.unnotarized = body["unnotarized"]
        for block, _, _ in chain.unnotarized:  # proposed, not notarized yet: no hyperblock holds them
            chain.blocks[block.shard].append(block)
            chain.block_index[block.hash] = block
        stalled, chain.faults.clock_offset_ms = body["faults"]
        chain.faults.stalled_shards = set(stalled)
        return chain

    # Snapshots --------------------------------------------------------------------------------------------
    def take(self, chain: LocalChain, genesis: dict[str, Any]) -> Snapshot:
        """Take a snapshot of what changed since the last written one; call it on the chain's event loop."""
        written = self._written
        changed, chain.submissions_changed = chain.submissions_changed, set()
        pending = {**written.submissions, **{h: chain.submissions[h] for h in changed}}
        new_records = islice(chain.records.values(), written.records, None)
        settled: list[TxRecord] = []
        unsettled: list[TxRecord] = []
        for record in (*written.unsettled, *new_records):
            (settled if record.settled else unsettled).append(record)
        after = _Written(
            history_length=0,
            hyperblocks=len(chain.hyperblocks),
            records=len(chain.records),
            unsettled=unsettled,
        )
        written.submissions = pending  # kept until written: a failed write leaves them to the next snapshot
        body = {
            "config": chain.config,
            "genesisMs": chain.genesis_ms,
            "round": chain.round,
            "faults": (sorted(chain.faults.stalled_shards), chain.faults.clock_offset_ms),
            "accounts": chain.world.accounts,
            "pool": chain.pool,
            "poolSenders": chain.pool_senders,
            "incoming": chain.incoming,
            "unnotarized": chain.unnotarized,
            "unsettled": unsettled,
            "genesis": genesis,
        }
        return Snapshot(
            hyperblocks=chain.hyperblocks[written.hyperblocks :],
            settled=settled,
            submissions=pending,
            first_new=written.hyperblocks,
            body=_dumps(body, first_new=after.hyperblocks),  # every hyperblock is in the history by then
            after=after,
        )

    def write(self, snapshot: Snapshot) -> int:
        """Append the history frame, then replace the head atomically; the bytes written. Runs in a thread:
        the history it serializes never changes, and one write runs at a time (`Localnet.save`)."""
        frame = b""
        if snapshot.hyperblocks or snapshot.settled or snapshot.submissions:
            payload = _dumps(
                (snapshot.hyperblocks, snapshot.settled, snapshot.submissions), first_new=snapshot.first_new
            )
            frame = FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        self.directory.mkdir(parents=True, exist_ok=True)
        before = self._written.history_length
        if before == 0 or not self.history_path.exists():
            before = len(_header())
            with self.history_path.open("wb") as history:
                history.write(_header())
                history.write(frame)
                _sync(history)
        else:
            with self.history_path.open("r+b") as history:
                # Bytes past the head's length are a write that did not complete: cut them off.
                if frame or history.seek(0, os.SEEK_END) != before:
                    history.truncate(before)
                    history.seek(before)
                    history.write(frame)
                    _sync(history)
        after = replace(snapshot.after, history_length=before + len(frame))
        index = {
            "historyLength": after.history_length,
            "hyperblocks": after.hyperblocks,
            "records": after.records,
        }
        head = _header() + pickle.dumps(index, protocol=PROTOCOL) + snapshot.body
        temporary = self._temporary
        with temporary.open("wb") as handle:
            handle.write(head)
            _sync(handle)
        os.replace(temporary, self.head_path)
        _sync_directory(self.directory)
        self._written = after
        return len(frame) + len(head)


def _sync(handle: IO[bytes]) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def config_difference(saved: ChainConfig, asked: ChainConfig) -> str | None:
    """How the saved chain's configuration differs from the one asked for (None when equal)."""
    differing = [
        f"{f.name} {getattr(saved, f.name)!r} (asked: {getattr(asked, f.name)!r})"
        for f in fields(ChainConfig)
        if getattr(saved, f.name) != getattr(asked, f.name)
    ]
    return ", ".join(differing) or None
