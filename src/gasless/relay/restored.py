"""The first start on a restored database: reconcile it with the chain before this host co-signs.

A restored database is a snapshot of the past (`gasless admin restore` marks it: `service_meta` key
`restore`, gasless.db.backup). Between the snapshot and now the chain moved on: intents in flight at the
snapshot may have executed, and the old hosts relayed more, which the snapshot does not hold. Serving it as
it is would send again what the chain already has (start-up recovery re-broadcasts every `COSIGNED` row)
and know nothing of the relays acknowledged after the backup. So before the signer claims its identity,
the start-up (`gasless.hosting.startup`) runs `RestoreReconciler`, once per restore:

1. every intent still `COSIGNED` in the snapshot that the chain knows is recorded as broadcast: the start-up
   recovery does not send it again, and the tracker follows it to FINALIZED (or DEAD) from what the chain
   says; nothing is signed again;
2. the hyperblocks from the recovery point (the highest final hyperblock the snapshot had seen: every relay
   acknowledged after the snapshot executed in a later one) to now are read, and every transaction one of
   this service's relayers co-signed that the database does not know is recovered as an intent (state
   BROADCAST, owned by this host: the tracker takes it to FINALIZED; billed by nobody: its usage row is
   unbilled, and `gasless admin restore-report` lists it);
3. the hyperblocks keep being read until the chain has shown no such unknown transaction for a quiet
   window (the signer fence's TTL, at least QUIET_ROUNDS rounds): a transaction co-signed by our relayers
   that this database does not know, appearing now, means a host of the old database still co-signs. The
   host then stays unready and does not sign (`/readyz` says why), until that host stops;
4. the settlement batches the contract holds beyond the snapshot's last one (read with `getSettlement` and
   from the `settleUsage` transactions of the hyperblocks read) are reconciled with the usage ledger
   (gasless.settlement.restored): matched rows are marked settled, the rows an unmatched batch may cover are
   held. Until the marker says `reconciled` the settlement worker builds and submits nothing.

Then the marker's state becomes `reconciled` with what was found, and the host starts as any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.addresses import METACHAIN
from gasless.chain.codec import WireError, signing_bytes, tx_from_wire, tx_hash, tx_to_wire
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.db import begin_write, dialect_insert, intents, service_meta
from gasless.settlement.restored import SettlementReconciler, is_settle_call

log = structlog.get_logger("gasless.relay.restored")

MARKER_KEY = "restore"  # gasless.db.restore.RESTORE_KEY
QUIET_ROUNDS = 5
SCAN_CONCURRENCY = 8
LOOK_CONCURRENCY = 16
EXECUTED = ("success", "fail", "invalid")
NOT_REBUILT_KEPT = 200  # transactions listed in the marker when they could not be rebuilt as intents


def now_ms() -> int:
    return int(time.time() * 1000)


async def read_marker(engine: AsyncEngine) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        value = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == MARKER_KEY))
    return dict(value) if isinstance(value, dict) else None


async def write_marker(engine: AsyncEngine, marker: dict[str, Any]) -> None:
    async with begin_write(engine) as conn:
        stamp = now_ms()
        await conn.execute(
            update(service_meta)
            .where(service_meta.c.key == MARKER_KEY)
            .values(value=marker, updated_at_ms=stamp)
        )


def relayer_of(chain_tx: dict[str, Any]) -> str | None:
    """The relayer of a transaction as the gateways list it (`relayerAddress`; `relayer` on some paths)."""
    value = chain_tx.get("relayerAddress") or chain_tx.get("relayer")
    return str(value) if value else None


def chain_wire(chain_tx: dict[str, Any]) -> dict[str, Any]:
    """The co-signed wire transaction of a transaction as a hyperblock lists it."""
    wire: dict[str, Any] = {
        "nonce": int(chain_tx.get("nonce") or 0),
        "value": str(chain_tx.get("value") or "0"),
        "receiver": chain_tx.get("receiver"),
        "sender": chain_tx.get("sender"),
        "gasPrice": int(chain_tx.get("gasPrice") or 0),
        "gasLimit": int(chain_tx.get("gasLimit") or 0),
        "chainID": chain_tx.get("chainID"),
        "version": int(chain_tx.get("version") or 0),
        "options": int(chain_tx.get("options") or 0),
        "signature": chain_tx.get("signature"),
        "relayer": relayer_of(chain_tx),
        "relayerSignature": chain_tx.get("relayerSignature"),
    }
    for name in ("data", "guardian", "guardianSignature", "senderUsername", "receiverUsername"):
        if chain_tx.get(name):
            wire[name] = chain_tx[name]
    return wire


def _block_ts_ms(item: dict[str, Any]) -> int:
    return int(item.get("timestampMs") or int(item.get("timestamp") or 0) * 1000)


class RestoreReconciler:
    """Runs the three steps above once per restore; a no-op (one read) on any other database."""

    def __init__(
        self,
        engine: AsyncEngine,
        gateway: GatewayClient,
        network: NetworkView,
        relayers: Iterable[str],
        *,
        host_id: str,
        quiet_ms: int,
        report: Callable[[str], None] = lambda _: None,
        settlement: SettlementReconciler | None = None,
    ) -> None:
        self.engine = engine
        self.gateway = gateway
        self.network = network
        self.relayers = frozenset(relayers)
        self.host_id = host_id
        self.quiet_ms = quiet_ms
        self.report = report  # the readiness check's `restore` text while it runs
        self.settlement = settlement  # step 4 (None: no billing contract configured)
        self._settle_txs: list[str] = []  # settleUsage transactions the hyperblocks read list
        self._recovered: list[str] = []  # hashes recovered as intents
        self._not_rebuilt: list[dict[str, Any]] = []
        self._latest_unknown_ts = 0  # the newest block (chain time) holding a co-signature we did not know

    async def run(self) -> dict[str, Any] | None:
        """The reconciled marker, or None when the database is not a restore waiting for it."""
        marker = await read_marker(self.engine)
        if marker is None or marker.get("state") != "pending":
            return None
        restore_id = str(marker.get("restoreId") or "restore")
        point = marker.get("recoveryPoint") or {}
        log.warning(
            "restored database: reconciling with the chain before co-signing",
            restore_id=restore_id,
            recovery_hyperblock=point.get("finalHyperblock"),
            backup_taken_at_ms=marker.get("backupTakenAtMs"),
        )
        on_chain = await self._cosigned_on_chain()
        newest = await self._newest()
        start = int(point["finalHyperblock"]) if point.get("finalHyperblock") is not None else newest
        self._recovered, self._not_rebuilt, self._latest_unknown_ts = [], [], 0
        self._settle_txs = []
        scanned_ts = await self._scan(start, newest, restore_id, catching_up=True)
        cursor = newest + 1
        watch_from = scanned_ts
        warned = 0
        while scanned_ts < max(watch_from, self._latest_unknown_ts) + self.quiet_ms:
            await asyncio.sleep(max(0.05, self.network.params.round_duration_ms / 2000))
            newest = await self._newest()
            if newest < cursor:
                continue
            before = len(self._recovered)
            scanned_ts = max(scanned_ts, await self._scan(cursor, newest, restore_id, catching_up=False))
            cursor = newest + 1
            if self._latest_unknown_ts > watch_from and len(self._recovered) > before:
                self.report(
                    "restore: the chain shows transactions co-signed by this service's relayers that this "
                    "database does not know, after it was restored: a host of the database the backup was "
                    "taken from still co-signs; stop it (waiting for the chain to be quiet)"
                )
                if time.monotonic() - warned > 10:
                    warned = time.monotonic()
                    log.error(
                        "restored database: another host still co-signs as this service's relayers",
                        restore_id=restore_id,
                        latest=self._recovered[-1],
                    )
            else:
                left = max(watch_from, self._latest_unknown_ts) + self.quiet_ms - scanned_ts
                self.report(f"restore: watching the chain for other co-signers ({max(0, left)} ms left)")
        if self.settlement is not None:
            self.report("restore: reconciling the settlement batches with the contract")
            marker["settlement"] = await self.settlement.run(marker, self._settle_txs)
        marker.update(
            state="reconciled",
            reconciledAtMs=now_ms(),
            reconciledBy=self.host_id,
            scanned={"fromHyperblock": start, "toHyperblock": cursor - 1},
            cosignedFoundOnChain=on_chain,
            recovered=len(self._recovered),
            notRebuilt=self._not_rebuilt[:NOT_REBUILT_KEPT],
        )
        await write_marker(self.engine, marker)
        log.warning(
            "restored database reconciled: relays the chain shows beyond the backup were recovered",
            restore_id=restore_id,
            recovered=len(self._recovered),
            not_rebuilt=len(self._not_rebuilt),
            cosigned_found_on_chain=on_chain,
            hyperblocks=f"{start}-{cursor - 1}",
            report="gasless admin restore-report",
        )
        return marker

    async def _newest(self) -> int:
        while True:
            meta = self.network.status(METACHAIN)
            if meta is not None:
                return int(meta.nonce)
            await asyncio.sleep(0.1)

    async def _cosigned_on_chain(self) -> int:
        """Step 1: the snapshot's COSIGNED intents the chain knows become BROADCAST (not sent again)."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(intents.c.pk, intents.c.tx_hash, intents.c.sender).where(
                        intents.c.state == "COSIGNED"
                    )
                )
            ).all()
        if not rows:
            return 0
        self.report(f"restore: asking the chain about {len(rows)} co-signed intents of the backup")
        limit = asyncio.Semaphore(LOOK_CONCURRENCY)
        found: list[tuple[int, int | None]] = []

        async def look(pk: int, hash_: str, sender: str) -> None:
            async with limit:
                for _ in range(5):
                    try:
                        chain_tx = await self.gateway.transaction(hash_, sender=sender)
                        break
                    except (GatewayUnavailable, GatewayRejected):
                        await asyncio.sleep(0.5)
                else:
                    return  # not known to be on chain: the start-up recovery sends it (same bytes)
            if chain_tx is not None:
                found.append((pk, _block_ts_ms(chain_tx) or None))

        await asyncio.gather(*(look(int(pk), str(h), str(s)) for pk, h, s in rows))
        if found:
            stamp = now_ms()
            async with begin_write(self.engine) as conn:
                for pk, ts in found:
                    await conn.execute(
                        update(intents)
                        .where(intents.c.pk == pk, intents.c.state == "COSIGNED")
                        .values(
                            state="BROADCAST",
                            broadcast_at_ms=ts or stamp,
                            seq=intents.c.seq + 1,
                            updated_at_ms=stamp,
                        )
                    )
            log.info("restored intents the chain already has: not sent again", count=len(found))
        return len(found)

    async def _hyperblock(self, nonce: int) -> dict[str, Any]:
        while True:
            try:
                data = await self.gateway.get(f"/hyperblock/by-nonce/{nonce}")
                return dict(data.get("hyperblock") or {})
            except (GatewayUnavailable, GatewayRejected) as exc:
                self.report(f"restore: hyperblock {nonce} unreadable ({type(exc).__name__}); retrying")
                await asyncio.sleep(0.5)

    async def _scan(self, first: int, last: int, restore_id: str, *, catching_up: bool) -> int:
        """Steps 2 and 3: read hyperblocks `first`..`last`, recover the unknown transactions of our relayers;
        the timestamp of the newest block read (0 when none)."""
        newest_ts = 0
        nonce = first
        while nonce <= last:
            batch = list(range(nonce, min(last, nonce + SCAN_CONCURRENCY - 1) + 1))
            if catching_up:
                self.report(
                    f"restore: reading hyperblock {batch[0]} of {first}..{last} (relays beyond the backup)"
                )
            blocks = await asyncio.gather(*(self._hyperblock(n) for n in batch))
            ours: dict[str, dict[str, Any]] = {}
            for block in blocks:
                block_ts = _block_ts_ms(block)
                newest_ts = max(newest_ts, block_ts)
                for chain_tx in block.get("transactions") or []:
                    if self.settlement is not None and is_settle_call(chain_tx, self.settlement.contract):
                        self._settle_txs.append(str(chain_tx["hash"]))
                    if relayer_of(chain_tx) not in self.relayers or not chain_tx.get("hash"):
                        continue
                    listed = {**chain_tx, "_blockTsMs": _block_ts_ms(chain_tx) or block_ts}
                    known = ours.get(chain_tx["hash"])
                    if known is None or chain_tx.get("status") in EXECUTED:
                        ours[chain_tx["hash"]] = listed
            if ours:
                await self._recover(ours, restore_id)
            nonce = batch[-1] + 1
        return newest_ts

    async def _recover(self, ours: dict[str, dict[str, Any]], restore_id: str) -> None:
        async with self.engine.connect() as conn:
            known = set(
                (
                    await conn.execute(select(intents.c.tx_hash).where(intents.c.tx_hash.in_(sorted(ours))))
                ).scalars()
            )
        unknown = [ours[h] for h in sorted(ours) if h not in known]
        if not unknown:
            return
        stamp = now_ms()
        rows: list[dict[str, Any]] = []
        for chain_tx in unknown:
            self._latest_unknown_ts = max(self._latest_unknown_ts, int(chain_tx["_blockTsMs"]))
            try:
                tx = tx_from_wire(chain_wire(chain_tx))
                rebuilt = tx_hash(tx)
            except (WireError, ValueError, TypeError) as exc:
                rebuilt, tx = f"not rebuilt: {exc}", None
            if tx is None or rebuilt != chain_tx["hash"]:
                self._not_rebuilt.append(
                    {
                        "txHash": chain_tx["hash"],
                        "sender": chain_tx.get("sender"),
                        "nonce": chain_tx.get("nonce"),
                        "relayer": relayer_of(chain_tx),
                        "status": chain_tx.get("status"),
                    }
                )
                log.warning(
                    "restored database: a relay beyond the backup could not be rebuilt as an intent",
                    tx_hash=chain_tx["hash"],
                )
                continue
            sender_shard = int(chain_tx.get("sourceShard") or 0)
            block_ts = int(chain_tx["_blockTsMs"]) or stamp
            rows.append(
                {
                    "sender": tx.sender.to_bech32(),
                    "nonce": int(tx.nonce),
                    "tx_hash": chain_tx["hash"],
                    "bytes_sha256": hashlib.sha256(signing_bytes(tx)).hexdigest(),
                    "state": "BROADCAST",
                    "seq": 1,
                    "sender_shard": sender_shard,
                    "receiver": tx.receiver.to_bech32(),
                    "relayer": tx.relayer.to_bech32(),
                    "cross_shard": int(chain_tx.get("destinationShard") or sender_shard) != sender_shard,
                    "gas_limit": int(tx.gas_limit),
                    "gas_price": int(tx.gas_price),
                    "value_atto": int(tx.value),
                    "lease_kind": "std",
                    # Who paid is not on chain: the relay is recorded unbilled (its usage row too).
                    "billing": {
                        "authMode": "signed_tx",
                        "billingClass": None,
                        "account": None,
                        "ru": None,
                        "free": False,
                        "recoveredBy": restore_id,
                    },
                    "intent_key": None,
                    "tx": tx_to_wire(tx),
                    "host_id": self.host_id,
                    "request_id": restore_id,
                    "received_at_ms": None,
                    # The co-signature's time is not on chain: its block's time bounds it from above.
                    "cosigned_at_ms": block_ts,
                    "broadcast_at_ms": block_ts,
                    "last_sent_at_ms": stamp,
                    "send_attempts": 0,
                    "updated_at_ms": stamp,
                }
            )
        if not rows:
            return
        async with begin_write(self.engine) as conn:
            inserted = []
            for row in rows:
                # Another transaction of the same slot (a replacement) may be stored: the next slot number.
                slot = await conn.scalar(
                    select(func.max(intents.c.slot_seq)).where(
                        intents.c.sender == row["sender"], intents.c.nonce == row["nonce"]
                    )
                )
                values = {**row, "slot_seq": 0 if slot is None else int(slot) + 1}
                result = await conn.execute(
                    dialect_insert(conn)(intents)
                    .values(**values)
                    .on_conflict_do_nothing()
                    .returning(intents.c.pk)
                )
                if result.first() is not None:
                    inserted.append(row["tx_hash"])
        self._recovered.extend(inserted)
        for tx_hash_ in inserted:
            log.info(
                "restored database: recovered a relay beyond the backup from the chain", tx_hash=tx_hash_
            )
