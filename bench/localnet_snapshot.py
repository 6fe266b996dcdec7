"""What saving localnet's chain costs (`gasless.localnet.persist`), for a chain of N transactions.

Builds a chain in process: N relayed transfers from M senders (half to new accounts, so the state grows
too), executed over rounds of `--per-round` transactions, then `--empty-rounds` rounds without any. Then it
measures, as `Localnet` does it:

- the first snapshot of that chain (everything goes to the history file: what a resumed chain never pays
  again, since its history is already on disk);
- steady snapshots: `--steady` times, one round with `--per-round` new transactions, then a snapshot. The
  time on the event loop (serializing) is what the round clock and the gateways wait for; the write runs in
  a thread;
- loading the saved chain (a restart).

The floor, measured in the same run: `pickle.dumps` of the whole chain state at once (what a snapshot that
rewrote everything would cost on the loop each time).

    .venv/bin/python bench/localnet_snapshot.py --txs 10000
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

from multiversx_sdk import Transaction, TransactionComputer, UserSecretKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.core.settings import LOCALNET_PAYMENT_TOKEN
from gasless.localnet.chain import ChainConfig
from gasless.localnet.server import Localnet

computer = TransactionComputer()


def localnet(data_dir: Path) -> Localnet:
    return Localnet(
        data_dir=data_dir,
        payment_token=LOCALNET_PAYMENT_TOKEN,
        config=ChainConfig(round_ms=600),
        auto_rounds=False,
    )


class Load:
    """Signed relayed transfers from `senders` fresh keys, each through its shard's relayer."""

    def __init__(self, net: Localnet, senders: int) -> None:
        self.net = net
        self.relayers = {}
        for relayer in net.genesis.relayers:
            self.relayers.setdefault(relayer.shard, relayer)
        self.keys = [UserSecretKey.generate() for _ in range(senders)]
        self.nonces = [0] * senders
        self.sent = 0

    def submit(self, count: int) -> None:
        for _ in range(count):
            index = self.sent % len(self.keys)
            key = self.keys[index]
            sender = address_of(key.generate_public_key().buffer)
            relayer = self.relayers[shard_of_pubkey(sender.get_public_key())]
            receiver = (
                address_of(UserSecretKey.generate().generate_public_key().buffer) if self.sent % 2 else sender
            )
            tx = Transaction(
                sender=sender,
                receiver=receiver,
                nonce=self.nonces[index],
                chain_id="localnet",
                version=2,
                gas_limit=100_000,
                gas_price=10**9,
                relayer=relayer.address,
            )
            message = computer.compute_bytes_for_signing(tx)
            tx.signature = key.sign(message)
            tx.relayer_signature = relayer.secret_key.sign(message)
            self.net.chain.submit(tx)
            self.nonces[index] += 1
            self.sent += 1


def whole_state_ms(net: Localnet) -> float:
    chain = net.chain
    state = (
        chain.hyperblocks,
        chain.records,
        chain.world.accounts,
        chain.pool,
        chain.incoming,
        chain.submissions,
    )
    started = time.perf_counter()
    pickle.dumps(state, protocol=5)
    return (time.perf_counter() - started) * 1000


async def run(args: argparse.Namespace) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="gasless-snapshot-"))
    net = localnet(data_dir)
    load = Load(net, args.senders)
    while load.sent < args.txs:
        load.submit(min(args.per_round, args.txs - load.sent))
        net.chain.produce_round()
    for _ in range(args.empty_rounds + 2):  # two more: the last cross-shard halves and finality
        net.chain.produce_round()
    chain = net.chain
    print(
        f"chain: {len(chain.records)} transactions, {len(chain.hyperblocks)} hyperblocks, "
        f"{len(chain.world.accounts)} accounts"
    )
    await net.start()  # the first snapshot
    first = net.last_snapshot
    assert first is not None
    print(
        f"first snapshot: {first.take_ms:.1f} ms on the loop, {first.write_ms:.1f} ms writing, {first.bytes} bytes"
    )
    takes, writes, sizes = [], [], []
    for _ in range(args.steady):
        load.submit(args.per_round)
        chain.produce_round()
        timing = await net.save()
        takes.append(timing.take_ms)
        writes.append(timing.write_ms)
        sizes.append(timing.bytes)
    print(
        f"steady snapshot (+1 round, +{args.per_round} transactions), median of {args.steady}: "
        f"{statistics.median(takes):.1f} ms on the loop (max {max(takes):.1f}), "
        f"{statistics.median(writes):.1f} ms writing, {int(statistics.median(sizes))} bytes"
    )
    floor = whole_state_ms(net)
    print(f"floor: pickle.dumps of the whole chain state at once: {floor:.1f} ms on the loop")
    await net.stop()
    files = {p.name: p.stat().st_size for p in sorted((data_dir / "chain").iterdir())}
    print(f"files: {files}")
    started = time.perf_counter()
    resumed = localnet(data_dir)
    print(f"load (restart): {(time.perf_counter() - started) * 1000:.0f} ms, resumed={resumed.resumed}")
    assert resumed.store is not None
    resumed.store.unlock()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txs", type=int, default=10_000)
    parser.add_argument("--senders", type=int, default=400)
    parser.add_argument("--per-round", type=int, default=100, help="new transactions per round")
    parser.add_argument("--empty-rounds", type=int, default=0)
    parser.add_argument("--steady", type=int, default=20, help="steady snapshots measured")
    args = parser.parse_args()
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
