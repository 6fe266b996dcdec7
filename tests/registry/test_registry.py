"""The relayer registry through HTTP: every relayer with its shard, the contract's state, assignability and
measured statistics, never a balance; the state follows the contract (retired on chain through
`gasless admin relayer-state`: the registry shows it with its history, and assign stops choosing it)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from relay_kit import key_in_shard  # type: ignore[import-not-found]
from typer.testing import CliRunner

from gasless.chain.addresses import address_of
from gasless.cli import app as cli

runner = CliRunner()


def wait_for(check: Any, what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)
    return value


def test_the_registry_lists_every_relayer_without_a_balance(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    relayed = env.relay(env.build(sender, assignment), assignment["lease"])
    assert relayed.status_code in (200, 202), relayed.text
    env.wait_state(relayed.json()["txHash"], ("FINALIZED",))

    answer = env.client.get("/v1/relayers")
    assert answer.status_code == 200 and answer.headers["Cache-Control"].startswith("public")
    assert "balance" not in answer.text.lower()
    items = answer.json()["items"]
    genesis = {w.address.to_bech32(): w.shard for w in env.localnet.net.genesis.relayers}
    assert {i["address"]: i["shard"] for i in items} == genesis
    assert all(i["state"] == "active" and i["assignable"] for i in items)
    used = next(i for i in items if i["address"] == assignment["relayer"])
    assert used["statistics"]["relays"] == 1 and used["statistics"]["executed"] == 1
    assert used["statistics"]["lastRelayAtMs"] is not None and used["statistics"]["windowMs"] == 86_400_000
    assert (
        env.client.get("/v1/relayers", headers={"If-None-Match": answer.headers["ETag"]}).status_code == 304
    )

    shard1 = env.client.get("/v1/relayers", params={"shard": 1}).json()["items"]
    assert {i["shard"] for i in shard1} == {1} and len(shard1) == 2
    assert env.client.get("/v1/relayers", params={"state": "retired"}).json()["items"] == []
    assert env.client.get("/v1/relayers", params={"shard": 7}).status_code == 400
    detail = env.client.get(f"/v1/relayers/{assignment['relayer']}").json()
    assert detail["stateHistory"][0]["toState"] == "active" and detail["stateHistory"][0]["fromState"] is None
    stranger = address_of(key_in_shard(1).generate_public_key().buffer).to_bech32()
    missing = env.client.get(f"/v1/relayers/{stranger}")
    assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"
    assert env.client.get("/v1/relayers/not-an-address").status_code == 400


def test_a_relayer_retired_on_chain_is_retired_in_the_registry_and_never_assigned(
    env: Any, operator: Any
) -> None:
    gone, kept = operator.relayers_in(env, 1)
    owner = str(env.localnet.net.genesis.owner.path)
    common = ["--gateway", env.localnet.url, "--contract", env.contract, "--owner-pem", owner]
    result = runner.invoke(cli, ["admin", "relayer-state", gone, "retired", *common])
    assert result.exit_code == 0, result.output

    def retired() -> Any:
        entry = env.client.get(f"/v1/relayers/{gone}").json()
        return entry if entry["state"] == "retired" else None

    entry = wait_for(retired, "the registry following the contract")
    assert entry["assignable"] is False
    # The state came from the view the interface contract names as the authority, asked per relayer.
    with urllib.request.urlopen(f"{env.localnet.url}/localnet/requests", timeout=5) as answer:
        asked = json.loads(answer.read())["data"]["requests"]
    assert asked.get("POST /vm-values/query getRelayerState", 0) > 0, asked
    change = entry["stateHistory"][-1]
    assert (change["fromState"], change["toState"], change["reason"]) == ("active", "retired", "contract")
    for _ in range(8):  # every new assignment in the shard goes to the other relayer
        sender = env.new_sender(1, plan=False)
        assert env.assign(sender)["relayer"] == kept
    bad = runner.invoke(cli, ["admin", "relayer-state", kept, "sleeping", *common])
    assert bad.exit_code == 2 and "active, draining, retired" in bad.output
    # Retired is final in the contract: it cannot come back.
    back = runner.invoke(cli, ["admin", "relayer-state", gone, "active", *common])
    assert back.exit_code == 1 and "ERR_RELAYER_RETIRED" in back.output
