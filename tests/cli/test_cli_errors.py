"""A CLI error is one line saying what is wrong, with the documented status: 2 for usage and configuration
(options, files, settings), 1 for an operation that was tried and failed. Real `gasless` processes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from process_kit import error_line, free_port, piped_env, run

from gasless.client import UserKey

EXIT_FAILED, EXIT_USAGE = 1, 2
RECEIVER = UserKey.generate().address


@pytest.fixture
def nowhere() -> str:
    """An API URL nothing answers on (these commands must fail before any request)."""
    return f"http://127.0.0.1:{free_port()}"


def bad_pems(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """PEM files that are not usable, and what the line must say about each."""
    text = tmp_path / "notes.pem"
    text.write_text("hello, I am not a key\n")
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN PRIVATE KEY for erd1x-----\nAAAA\n-----END PRIVATE KEY for erd1x-----\n")
    binary = tmp_path / "binary.pem"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 64)
    return {
        "missing": (tmp_path / "nope.pem", "no such file"),
        "directory": (tmp_path, "is a directory"),
        "not a PEM": (text, "not a PEM file"),
        "binary": (binary, "not a PEM file"),
        "garbled": (garbled, "not a MultiversX wallet PEM"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "not a PEM", "binary", "garbled"])
def test_relay_send_with_an_unusable_pem_is_one_line(case: str, tmp_path: Path, nowhere: str) -> None:
    path, why = bad_pems(tmp_path)[case]
    result = run("relay", "send", "--pem", str(path), "--to", RECEIVER, "--api", nowhere, "--nonce", "0")
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert f"--pem {path}" in line and why in line, line


@pytest.mark.parametrize("case", ["missing", "garbled"])
def test_admin_owner_pem_unusable_is_one_line(case: str, tmp_path: Path) -> None:
    path, why = bad_pems(tmp_path)[case]
    contract = "erd1qqqqqqqqqqqqqpgqaln60s68nledk2s6tw5ft0hljgwstjfns9tqrq7s0c"
    result = run(
        "admin", "grant", RECEIVER, "1", "1",
        "--owner-pem", str(path), "--contract", contract, "--gateway", f"http://127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert f"--owner-pem {path}" in line and why in line, line


@pytest.mark.parametrize("missing", ["both", "--owner-pem", "--contract"])
def test_admin_grant_without_owner_or_contract_is_a_usage_error(missing: str, tmp_path: Path) -> None:
    owner = tmp_path / "owner.pem"
    owner.write_text(UserKey.generate().to_pem_text())
    given = {
        "--owner-pem": str(owner),
        "--contract": "erd1qqqqqqqqqqqqqpgqaln60s68nledk2s6tw5ft0hljgwstjfns9tqrq7s0c",
    }
    args = [
        arg for option, value in given.items() if missing not in ("both", option) for arg in (option, value)
    ]
    result = run("admin", "grant", RECEIVER, "1", "1", *args)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert "failed" not in line, line
    expected = ["--owner-pem", "--contract"] if missing == "both" else [missing]
    assert all(option in line for option in expected), line


def test_invalid_settings_are_one_line(tmp_path: Path) -> None:
    result = run("serve", env=piped_env(GASLESS_DATA_DIR=str(tmp_path), GASLESS_METRICS_PORT="lots"))
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert "GASLESS_METRICS_PORT" in line and "lots" in line, line


@pytest.mark.parametrize(
    ("workers", "settings", "expected"),
    [
        ("2", {}, "needs PostgreSQL"),  # SQLite, the default: one writer
        ("2", {"GASLESS_DATABASE_URL": "postgresql+asyncpg://nobody@127.0.0.1:1/x"}, "Redis"),
        ("17", {}, "at most 16"),
    ],
)
def test_serve_workers_without_what_they_share_is_refused(
    workers: str, settings: dict[str, str], expected: str, tmp_path: Path
) -> None:
    env = piped_env(
        GASLESS_DATA_DIR=str(tmp_path), GASLESS_MASTER_SECRET="m" * 32, GASLESS_REDIS_URL="", **settings
    )
    result = run("serve", "--workers", workers, "--port", str(free_port()), env=env)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert expected in line and "--workers" in line, line
    assert not (tmp_path / "gasless.db").exists()  # refused before anything started


@pytest.mark.parametrize("holder", ["a plain listener", "a listener with SO_REUSEPORT"])
def test_serve_workers_refuses_a_port_another_program_holds(holder: str, tmp_path: Path) -> None:
    """The parent only reserves the port (the workers listen with SO_REUSEPORT): a port bound by another
    program, or listened on by one that also set SO_REUSEPORT (a stale gasless), is refused."""
    with socket.socket() as other:
        if holder != "a plain listener":
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = piped_env(
            GASLESS_DATA_DIR=str(tmp_path),
            GASLESS_MASTER_SECRET="m" * 32,
            GASLESS_DATABASE_URL="postgresql+asyncpg://nobody@127.0.0.1:1/x",
            GASLESS_REDIS_URL="redis://127.0.0.1:1/0",
        )
        result = run("serve", "--workers", "2", "--port", str(port), env=env)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert f"127.0.0.1:{port} is in use" in line and "--port" in line, line


def test_verify_proof_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    result = run("verify-proof", str(tmp_path / "proof.json"), "--gateway", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    assert str(tmp_path / "proof.json") in error_line(result)
