"""How many Relayed-V3 transactions per second localnet accepts and executes.

Starts `gasless localnet` in its own process, pre-signs N relayed transfers from M fresh senders (sender and
relayer signatures by multiversx-sdk), sends them through `POST /transaction/send-multiple` in batches at a
given concurrency, and waits until every one has executed. In the same run it measures the floor: the bare
cost of the same per-transaction work in a tight loop in one process (parse the wire JSON, verify the
sender and relayer signatures, hash), which is what a single core could at best validate.

    .venv/bin/python bench/localnet.py --txs 20000 --senders 400 --batch 200 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from multiversx_sdk import Transaction, TransactionComputer, UserPEM, UserSecretKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.chain.codec import signing_bytes, tx_from_wire, tx_hash
from gasless.localnet.processing import check_signatures

ROOT = Path(__file__).resolve().parent.parent
computer = TransactionComputer()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_transactions(data_dir: Path, count: int, senders: int, chain_id: str) -> list[dict]:
    relayers: dict[int, list] = {}
    for pem_path in sorted((data_dir / "localnet" / "wallets").glob("relayer-s*.pem")):
        key = UserPEM.from_file(pem_path).secret_key
        shard = shard_of_pubkey(key.generate_public_key().buffer)
        relayers.setdefault(shard, []).append(key)
    keys = [UserSecretKey.generate() for _ in range(senders)]
    nonces = [0] * senders
    out = []
    for i in range(count):
        s = i % senders
        key = keys[s]
        sender = address_of(key.generate_public_key().buffer)
        relayer_key = relayers[shard_of_pubkey(sender.get_public_key())][0]
        tx = Transaction(
            sender=sender,
            receiver=sender,
            nonce=nonces[s],
            chain_id=chain_id,
            version=2,
            gas_limit=100_000,
            gas_price=10**9,
            relayer=address_of(relayer_key.generate_public_key().buffer),
        )
        nonces[s] += 1
        message = computer.compute_bytes_for_signing(tx)
        tx.signature = key.sign(message)
        tx.relayer_signature = relayer_key.sign(message)
        out.append(tx.to_dictionary())
    return out


def floor(wires: list[dict]) -> float:
    """Transactions per second one core validates: parse, verify both signatures, hash."""
    sample = wires[: min(len(wires), 3_000)]
    start = time.perf_counter()
    for wire in sample:
        tx = tx_from_wire(wire)
        signing_bytes(tx)
        check_signatures(tx)
        tx_hash(tx)
    return len(sample) / (time.perf_counter() - start)


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"{url}/network/config") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("localnet did not start")


async def run_load(url: str, wires: list[dict], batch: int, concurrency: int) -> dict[str, float]:
    batches = [wires[i : i + batch] for i in range(0, len(wires), batch)]
    queue: asyncio.Queue[list[dict]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)
    accepted = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def worker() -> None:
            nonlocal accepted
            while not queue.empty():
                payload = queue.get_nowait()
                if len(payload) == 1:  # one transaction per request, as a relayer broadcasts
                    async with http.post(
                        f"{url}/transaction/send",
                        data=json.dumps(payload[0]),
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        body = await resp.json()
                        accepted += 1 if body["code"] == "successful" else 0
                    continue
                async with http.post(
                    f"{url}/transaction/send-multiple",
                    data=json.dumps(payload),
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    body = await resp.json()
                    accepted += body["data"]["numOfSentTxs"]

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        sent_s = time.perf_counter() - start
        # Executed: every sender's nonce reached its count.
        expected: dict[str, int] = {}
        for w in wires:
            expected[w["sender"]] = max(expected.get(w["sender"], 0), w["nonce"] + 1)
        pending = set(expected)
        while pending:
            async with http.get(f"{url}/localnet/snapshot") as resp:
                accounts = (await resp.json())["data"]["accounts"]
            pending = {a for a in pending if accounts.get(a, {}).get("nonce", 0) < expected[a]}
            if pending:
                await asyncio.sleep(0.05)
        total_s = time.perf_counter() - start
    return {"accepted": accepted, "send_seconds": sent_s, "total_seconds": total_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txs", type=int, default=20_000)
    parser.add_argument("--senders", type=int, default=400)
    parser.add_argument(
        "--batch",
        type=int,
        default=200,
        help="transactions per send-multiple; 1 = POST /transaction/send each",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--round-ms", type=int, default=600)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="gasless-bench-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gasless.cli",
            "localnet",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--round-ms",
            str(args.round_ms),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    try:
        asyncio.run(wait_ready(url))
        print(f"pre-signing {args.txs} relayed transactions from {args.senders} senders ...", flush=True)
        wires = build_transactions(data_dir, args.txs, args.senders, "localnet")
        floor_tps = floor(wires)
        result = asyncio.run(run_load(url, wires, args.batch, args.concurrency))
    finally:
        proc.terminate()
        proc.wait(10)
    accepted_tps = result["accepted"] / result["send_seconds"]
    executed_tps = result["accepted"] / result["total_seconds"]
    print(
        f"localnet: {result['accepted']}/{args.txs} accepted, batch {args.batch}, concurrency {args.concurrency}, "
        f"round {args.round_ms} ms"
    )
    print(f"  accepted          {accepted_tps:10.0f} tx/s  ({result['send_seconds']:.2f} s)")
    print(
        f"  accepted+executed {executed_tps:10.0f} tx/s  ({result['total_seconds']:.2f} s to the last execution)"
    )
    print(f"  floor (one core: parse + 2 signature checks + hash in a tight loop) {floor_tps:10.0f} tx/s")
    print(
        f"  ratio accepted/floor {accepted_tps / floor_tps:.2f}; executed/floor {executed_tps / floor_tps:.2f}"
    )
    return 0 if result["accepted"] == args.txs else 1


if __name__ == "__main__":
    sys.exit(main())
