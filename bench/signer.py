"""Relayer signatures: PEM keys in process against keys in a PKCS#11 token (SoftHSM 2, a token of the run's
own in a temporary directory), through the `Signer` interface the relay uses (`sign_with_deadline`).

- latency: one signature at a time (p50, p99, max), each verified before it is returned (the token's);
- throughput: 64 signatures in flight, for 1, 4 and 8 token sessions (signing threads);
- the token removed: how long the first signature after the removal takes to be refused, how long an idle
  signer takes to notice (its liveness check), and how long it takes to sign again once the token is back.

    .venv/bin/python bench/signer.py [--count 5000]

docs/keys.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multiversx_sdk import UserSecretKey

MODULES = ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
LABEL, PIN = "bench", "bench-pin-1234"
MESSAGE = os.urandom(250)  # about a transfer's signing bytes


def ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.3f}"


async def latency(signer: object, relayer: str, count: int) -> str:
    from gasless.signer import sign_with_deadline

    took = []
    for _ in range(count):
        started = time.perf_counter()
        await sign_with_deadline(signer, relayer, MESSAGE, 250)  # type: ignore[arg-type]
        took.append(time.perf_counter() - started)
    return f"p50 {ms(took, 0.5)} ms, p99 {ms(took, 0.99)} ms, max {max(took) * 1000:.3f} ms"


async def throughput(signer: object, relayer: str, count: int, in_flight: int = 64) -> float:
    from gasless.signer import sign_with_deadline

    left = count

    async def one_lane() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await sign_with_deadline(signer, relayer, MESSAGE, 2_000)  # type: ignore[arg-type]

    started = time.perf_counter()
    await asyncio.gather(*(one_lane() for _ in range(in_flight)))
    return count / (time.perf_counter() - started)


async def until(check: object, timeout: float = 30.0) -> float:
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - started < timeout, "not within the timeout"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


def usable(signer: object) -> bool:
    from gasless.signer import SignerError

    try:
        signer.check()  # type: ignore[attr-defined]
    except SignerError:
        return False
    return True


async def removal(signer: object, relayer: str, tokens: Path) -> list[str]:
    from gasless.signer import SignerError, sign_with_deadline

    backup = tokens.with_name("backup")
    lines = []
    for idle in (False, True):
        shutil.copytree(tokens, backup)
        shutil.rmtree(tokens)
        if idle:
            lines.append(
                f"idle signer notices the removal after {await until(lambda: not usable(signer)):.2f} s"
            )
        else:
            started = time.perf_counter()
            try:
                await sign_with_deadline(signer, relayer, MESSAGE, 250)  # type: ignore[arg-type]
                lines.append("a signature after the removal was made (not refused)")
            except SignerError as exc:
                took = (time.perf_counter() - started) * 1000
                lines.append(f"first signature after the removal refused in {took:.2f} ms ({exc.code})")
        shutil.copytree(backup, tokens)
        shutil.rmtree(backup)
        back = await until(lambda: usable(signer))
        await sign_with_deadline(signer, relayer, MESSAGE, 250)  # type: ignore[arg-type]
        lines.append(f"signing again {back:.2f} s after the token is back")
    return lines


async def main(count: int) -> None:
    from gasless.signer import PemSigner
    from gasless.signer.pkcs11 import Pkcs11Config, Pkcs11Signer
    from gasless.signer.pkcs11_keys import KeyRef, import_key
    from gasless.signer.pkcs11_library import token_session

    module = next((Path(m) for m in MODULES if Path(m).is_file()), None)
    if module is None or shutil.which("softhsm2-util") is None:
        sys.exit("needs SoftHSM 2: apt-get install softhsm2")
    version = subprocess.run(["softhsm2-util", "--version"], capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="gasless-bench-signer-"))
    try:
        tokens = work / "tokens"
        tokens.mkdir()
        conf = work / "softhsm2.conf"
        conf.write_text(f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n")
        os.environ["SOFTHSM2_CONF"] = str(conf)
        subprocess.run(
            [
                "softhsm2-util",
                "--init-token",
                "--free",
                "--label",
                LABEL,
                "--so-pin",
                "so-1234",
                "--pin",
                PIN,
            ],
            check=True,
            capture_output=True,
        )
        key = UserSecretKey.generate()
        with token_session(module, LABEL, PIN, rw=True) as session:
            import_key(session, bytes(key.buffer), label="relayer", key_id=b"\x01")
        pem = PemSigner([key])
        relayer = pem.relayers()[0].bech32
        print(f"SoftHSM {version}, {count} signatures of {len(MESSAGE)} bytes")
        print(f"pem      latency: {await latency(pem, relayer, count)}")
        print(f"pem      throughput: {await throughput(pem, relayer, count):,.0f} signatures/s")
        for sessions in (1, 4, 8):
            config = Pkcs11Config(module, LABEL, PIN, (KeyRef(label="relayer"),), sessions=sessions)
            signer = await asyncio.to_thread(Pkcs11Signer.open, config)
            try:
                if sessions == 4:
                    print(f"pkcs11   latency: {await latency(signer, relayer, count)}")
                rate = await throughput(signer, relayer, count)
                print(f"pkcs11   throughput, {sessions} session(s): {rate:,.0f} signatures/s")
                if sessions == 4:
                    for line in await removal(signer, relayer, tokens):
                        print(f"pkcs11   {line}")
            finally:
                await signer.aclose()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5_000)
    asyncio.run(main(parser.parse_args().count))
