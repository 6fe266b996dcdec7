"""The ABI files and the models agree: every endpoint, view and event goes through the SDK codec."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from contract_harness import (
    GENESIS_MS,
    ONE_USDC,
    USDC,
    Stack,
    decode_events,
    deploy_stack,
    transaction_events,
    user_pubkey,
)
from multiversx_sdk import TransactionEventsParser
from multiversx_sdk.abi import Abi
from multiversx_sdk.abi.type_formula import TypeFormula
from multiversx_sdk.abi.type_formula_parser import TypeFormulaParser

from gasless.chain.abi import (
    decode_args,
    decode_outputs,
    encode_args,
    encode_event,
    encode_outputs,
    load_billing_abi,
    load_pair_abi,
    load_wrapper_abi,
)
from gasless.localnet.contracts import BILLING_GAS
from gasless.localnet.contracts.seed import SEED_FREE_OPERATIONS
from gasless.localnet.vm import LogEvent

ABIS = {"billing": load_billing_abi, "pair": load_pair_abi, "wrapper": load_wrapper_abi}
_parser = TypeFormulaParser()


def sample(abi: Abi, formula: TypeFormula | str) -> Any:
    """A native sample value of an ABI type."""
    if isinstance(formula, str):
        formula = _parser.parse_expression(formula)
    name, params = formula.name, formula.type_parameters
    simple = {
        "bool": True,
        "u8": 6,
        "u16": 300,
        "u32": 70_000,
        "u64": 2**40 + 5,
        "BigUint": 10**20 + 1,
        "Address": user_pubkey("sample"),
        "TokenIdentifier": USDC,
        "bytes": b"subscribe",
    }
    if name in simple:
        return simple[name]
    if name.startswith("array"):
        return bytes(range(int(name[5:])))
    if name in ("List", "variadic"):
        return [sample(abi, params[0]), sample(abi, params[0])]
    if name == "Option":
        return sample(abi, params[0])
    types = abi.definition.types
    if name in types.structs:
        return {f.name: sample(abi, f.type) for f in types.structs[name].fields}
    if name in types.enums:
        return types.enums[name].variants[-1].name
    raise AssertionError(f"no sample for {name}")


@pytest.mark.parametrize("which", sorted(ABIS))
def test_every_endpoint_encodes_and_round_trips(which: str) -> None:
    abi = ABIS[which]()
    assert abi.definition.endpoints
    for endpoint in abi.definition.endpoints:
        values = [sample(abi, p.type) for p in endpoint.inputs]
        parts = encode_args(abi, endpoint.name, values)
        assert abi.encode_endpoint_input_parameters(endpoint.name, values) == parts
        assert encode_args(abi, endpoint.name, decode_args(abi, endpoint.name, parts)) == parts, endpoint.name
        outputs = [sample(abi, p.type) for p in endpoint.outputs]
        out_parts = encode_outputs(abi, endpoint.name, outputs)
        decoded = abi.decode_endpoint_output_parameters(endpoint.name, out_parts)
        assert encode_outputs(abi, endpoint.name, decoded) == out_parts, endpoint.name


@pytest.mark.parametrize("which", sorted(ABIS))
def test_every_event_encodes_and_decodes_with_the_sdk_parser(which: str) -> None:
    abi = ABIS[which]()
    parser = TransactionEventsParser(abi, first_topic_as_identifier=True)
    for event in abi.definition.events:
        fields = {i.name: sample(abi, i.type) for i in event.inputs}
        topics, data = encode_event(abi, event.identifier, fields)
        assert len(topics) == sum(i.indexed for i in event.inputs)
        log = LogEvent(
            address=user_pubkey("c"), identifier="x", topics=[event.identifier.encode(), *topics], data=data
        )
        parsed = vars(parser.parse_event(transaction_events([log])[0]))
        assert encode_event(abi, event.identifier, parsed) == (topics, data), event.identifier


def test_billing_abi_lists_the_design_endpoints_views_and_events() -> None:
    abi = load_billing_abi()
    endpoints = {e.name: e for e in abi.definition.endpoints}
    assert {
        "deposit",
        "depositFor",
        "subscribe",
        "depositAndSubscribe",
        "setAutoRenew",
        "setPayg",
        "releaseEscrow",
        "renew",
        "addSenders",
        "removeSenders",
        "grant",
        "settleUsage",
        "setPaused",
    } <= set(endpoints)
    views = {n for n, e in endpoints.items() if e.mutability == "readonly"}
    assert {
        "getConfig",
        "getPauseState",
        "getRateClasses",
        "getTariffHistory",
        "getRelayerState",
        "getAccount",
    } <= views
    assert [p.name for p in endpoints["setPayg"].inputs] == [
        "enabled",
        "budget",
        "auto_topup",
        "max_payg_price",
    ]
    assert [p.name for p in endpoints["depositAndSubscribe"].inputs] == [
        "tier_id",
        "months",
        "max_price",
        "ref",
    ]
    payable = {n for n, e in endpoints.items() if e.payable_in_tokens}
    assert payable == {"deposit", "depositFor", "depositAndSubscribe"}
    events = {e.identifier for e in abi.definition.events}
    assert {
        "deposit",
        "subscribed",
        "senderAdded",
        "senderRemoved",
        "usageSettled",
        "renewed",
        "renewalSkipped",
        "escrowMoved",
        "paygSettled",
        "senderFee",
        "granted",
        "tariffChanged",
    } <= events
    assert set(BILLING_GAS) == {n for n in endpoints if n not in views}


# Views decode to the seeded configuration -------------------------------------------------------------
@pytest.fixture
def stack() -> Stack:
    return deploy_stack()


def test_views_decode_to_the_seed(stack: Stack) -> None:
    abi = load_billing_abi()
    raw = stack.chain.query(stack.billing_address, "getRateClasses")
    classes = abi.decode_endpoint_output_parameters("getRateClasses", raw)[0]
    table = [
        (
            c.id,
            c.ru_per_sec,
            c.ru_burst,
            c.gas_per_sec_per_shard,
            c.gas_burst_per_shard,
            c.max_gas_limit,
            c.ru_per_hour,
        )
        for c in classes
    ]
    m = 1_000_000
    assert table == [
        (1, 1, 15, 20 * m, 200 * m, 100 * m, 300),
        (2, 5, 25, 50 * m, 600 * m, 600 * m, 600),
        (3, 20, 60, 100 * m, 1_000 * m, 600 * m, 1_500),
        (4, 50, 150, 150 * m, 1_500 * m, 600 * m, 3_000),
        (5, 100, 300, 200 * m, 2_000 * m, 600 * m, 6_000),
        (6, 2, 15, 20 * m, 200 * m, 100 * m, 300),
    ]
    tiers = stack.view("getTiers")[0]
    assert [(t.name, t.audience.__name__, t.rate_class, t.purchasable) for t in tiers] == [
        (b"Starter", "Human", 1, True),
        (b"Builder", "Human", 2, True),
        (b"Growth", "Human", 3, True),
        (b"Scale", "Human", 4, True),
        (b"Enterprise", "Human", 5, False),
        (b"Agent Pro", "Agent", 3, True),
        (b"Agent Fleet", "Agent", 5, True),
        (b"Agent Metered", "Agent", 6, True),
    ]
    metered = tiers[-1]
    assert (metered.period_ms, metered.payg, metered.price_micro) == (0, True, 0)
    config = stack.view("getConfig")[0]
    assert (config.owner, config.payment_token, config.pair, config.wrapper, config.gas_tank) == (
        stack.owner,
        USDC,
        stack.pair_address,
        stack.wrapper_address,
        stack.gas_tank,
    )
    assert (
        config.deposit_min_micro,
        config.deposit_max_micro,
        config.ru_price_micro,
        config.sender_fee_ru,
    ) == (ONE_USDC, 10_000 * ONE_USDC, 200, 50)
    assert [op.decode() for op in config.free_operations] == list(SEED_FREE_OPERATIONS)
    assert (config.swap_share_bps, config.swap_budget_micro, config.policy_version) == (
        1_000,
        50_000 * ONE_USDC,
        1,
    )
    history = stack.view("getTariffHistory")[0]
    assert [e.seq for e in history] == list(range(1, len(history) + 1))
    assert {e.policy_version for e in history} == {1} and {e.timestamp_ms for e in history} == {GENESIS_MS}
    kinds = {e.kind.__name__ for e in history}
    assert {
        "TierPrice",
        "TierIncludedRu",
        "RateClassRuPerSec",
        "SenderFeeRu",
        "RuPrice",
        "DepositMin",
    } <= kinds
    relayer = user_pubkey("relayer-1")
    info = stack.view("getRelayerState", relayer)[0]
    assert (info.relayer, info.state.__name__, info.since_ms) == (relayer, "Active", GENESIS_MS)
    assert stack.view("getRelayerState", user_pubkey("nobody")) == [None]
    assert stack.view("getAccount", user_pubkey("nobody")) == [None]


def test_tariff_history_is_append_only_and_versioned(stack: Stack) -> None:
    before = stack.view("getTariffHistory")[0]
    receipt = stack.tx(
        stack.owner, "setTier", 1, b"Starter", "Human", 1, 12 * ONE_USDC, 40_000, 2_592_000_000, True, False
    )
    assert receipt.ok, receipt.error
    events = stack.billing_events(receipt, "tariffChanged")
    assert [(e.kind.__name__, e.subject_id, e.value, e.policy_version) for e in events] == [
        ("TierPrice", 1, 12 * ONE_USDC, 2),
        ("TierIncludedRu", 1, 40_000, 2),
    ]
    after = stack.view("getTariffHistory")[0]
    assert len(after) == len(before) + 2
    assert [vars(e) for e in after[: len(before)]] == [vars(e) for e in before]
    assert [e.seq for e in events] == [after[-2].seq, after[-1].seq]
    assert stack.view("getConfig")[0].policy_version == 2
    # The same values again change nothing.
    receipt = stack.tx(stack.owner, "setRuPrice", 200)
    assert receipt.ok and receipt.events == []
    assert stack.tx(stack.owner, "setRuPrice", 250).ok
    assert stack.view("getConfig")[0].policy_version == 3


def test_owner_configuration_refusals_and_effects(stack: Stack) -> None:
    owner = stack.owner
    assert stack.tx(owner, "setRateClass", 7, 10, 5, 1, 1, 1, 1).error == "ERR_BAD_RATE_CLASS"
    assert stack.tx(owner, "setRateClass", 7, 10, 20, 10 * 10**6, 100 * 10**6, 100 * 10**6, 600).ok
    assert stack.view("getRateClasses")[0][-1].id == 7
    assert (
        stack.tx(owner, "setTier", 9, b"X", "Agent", 42, 1, 1, 1, True, False).error
        == "ERR_UNKNOWN_RATE_CLASS"
    )
    assert stack.tx(owner, "setDepositBounds", 10, 5).error == "ERR_BAD_DEPOSIT_BOUNDS"
    assert stack.tx(owner, "setSwapConfig", 10_001, 0).error == "ERR_BAD_SWAP_SHARE"
    assert stack.tx(owner, "setFreeOperations", [b"deposit", b"noSuchThing"]).error == "ERR_UNKNOWN_ENDPOINT"
    assert stack.tx(owner, "setFreeOperations", [b"deposit", b"renew"]).ok
    assert stack.view("getConfig")[0].free_operations == [b"deposit", b"renew"]
    relayer = user_pubkey("relayer-2")
    receipt = stack.tx(owner, "setRelayerState", relayer, "Draining")
    (changed,) = stack.billing_events(receipt, "relayerStateChanged")
    assert (changed.relayer, changed.state.__name__, changed.since_ms) == (relayer, "Draining", GENESIS_MS)
    assert stack.tx(owner, "setRelayerState", relayer, "Retired").ok
    assert stack.tx(owner, "setRelayerState", relayer, "Active").error == "ERR_RELAYER_RETIRED"
    relayers = stack.view("getRelayers")[0]
    assert [(r.relayer, r.state.__name__) for r in relayers] == [
        (user_pubkey("relayer-1"), "Active"),
        (relayer, "Retired"),
    ]
    assert stack.tx(owner, "setAccountSuspended", user_pubkey("ghost"), True).error == "ERR_UNKNOWN_ACCOUNT"


# Call plumbing ----------------------------------------------------------------------------------------
def test_owner_only_endpoints_refuse_other_callers(stack: Stack) -> None:
    abi = load_billing_abi()
    mallory = stack.user("mallory")
    owner_only = [e for e in abi.definition.endpoints if e.only_owner]
    assert len(owner_only) == 13
    before = copy.deepcopy(stack.billing.state)
    for endpoint in owner_only:
        values = [sample(abi, p.type) for p in endpoint.inputs]
        receipt = stack.tx(mallory, endpoint.name, *values)
        assert receipt.error == "ERR_NOT_OWNER", endpoint.name
    assert stack.billing.state == before
    assert stack.chain.call(mallory, stack.pair_address, "pause").error == "ERR_NOT_OWNER"


def test_non_payable_endpoints_refuse_payments(stack: Stack) -> None:
    abi = load_billing_abi()
    alice = stack.user("alice")
    for endpoint in abi.definition.endpoints:
        if endpoint.payable_in_tokens or endpoint.only_owner or endpoint.mutability == "readonly":
            continue
        values = [sample(abi, p.type) for p in endpoint.inputs]
        receipt = stack.tx(alice, endpoint.name, *values, usdc=ONE_USDC)
        assert receipt.error == "function does not accept payment", endpoint.name
        assert stack.chain.balance(alice, USDC) == 10_000 * ONE_USDC


def test_unknown_function_bad_arguments_and_query_of_a_non_view(stack: Stack) -> None:
    alice = stack.user("alice")
    assert (
        stack.chain.call(alice, stack.billing_address, "noSuchEndpoint").error
        == "invalid function (not found)"
    )
    assert stack.chain.call(alice, stack.billing_address, "setAutoRenew").error == "wrong number of arguments"
    assert stack.chain.call(alice, stack.billing_address, "setAutoRenew", [b"\x01", b"\x01"]).error == (
        "wrong number of arguments"
    )
    error = stack.chain.call(alice, stack.billing_address, "setAutoRenew", [b"\x02"]).error
    assert error is not None and error.startswith("argument decode error")
    with pytest.raises(Exception, match="invalid function"):
        stack.chain.query(stack.billing_address, "deposit")


def test_views_may_also_be_called_in_a_transaction(stack: Stack) -> None:
    receipt = stack.chain.call(stack.user("alice"), stack.billing_address, "getPauseState")
    assert receipt.ok
    state = decode_outputs(load_billing_abi(), "getPauseState", receipt.returned)[0]
    assert (state.paused, state.deposits_paused) == (False, False)


def test_events_of_a_purchase_decode_through_the_sdk_parser(stack: Stack) -> None:
    alice = stack.user("alice")
    receipt = stack.tx(alice, "depositAndSubscribe", 1, 1, 9 * ONE_USDC, bytes(32), usdc=9 * ONE_USDC)
    billing_events = [e for e in receipt.events if e.address == stack.billing_address]
    decoded = decode_events(load_billing_abi(), billing_events)
    assert [name for name, _ in decoded] == ["gasFunded", "deposit", "subscribed"]
    assert decoded[2][1].price == 9 * ONE_USDC and decoded[1][1].credits_after == 9 * ONE_USDC


def test_state_copies_share_records_but_not_containers(stack: Stack) -> None:
    alice = stack.user("alice")
    assert stack.tx(alice, "deposit", usdc=5 * ONE_USDC).ok
    state = stack.billing.state
    clone = copy.deepcopy(state)
    assert clone == state
    assert clone.accounts is not state.accounts and clone.accounts[alice] is state.accounts[alice]
    assert clone.tiers[1] is state.tiers[1] and clone.pause is not state.pause
    clone.accounts.clear()
    clone.pause.paused = True
    assert alice in state.accounts and state.pause.paused is False


def test_gas_cost_depends_on_the_function_only(stack: Stack) -> None:
    billing = stack.billing
    assert billing.gas_cost("deposit") == billing.gas_cost("deposit") == 6_000_000
    assert (
        billing.gas_cost("depositAndSubscribe")
        > billing.gas_cost("subscribe")
        > billing.gas_cost("setAutoRenew")
    )
    assert billing.gas_cost("getConfig") == 2_000_000
    assert stack.pair.gas_cost("swapTokensFixedInput") == 4_000_000


def test_snapshots_are_json(stack: Stack) -> None:
    alice = stack.user("alice")
    assert stack.tx(alice, "deposit", usdc=5 * ONE_USDC).ok
    assert stack.tx(alice, "addSenders", 10**6, [user_pubkey("s")]).ok
    for model in (stack.billing, stack.pair, stack.wrapper):
        text = json.dumps(model.snapshot())
        assert model.name in text
    snap = stack.billing.snapshot()
    (account,) = snap["accounts"].values()
    assert account["credits_micro"] == 5 * ONE_USDC - 10_000 and len(account["senders"]) == 1
    assert snap["config"]["owner"].startswith("erd1")
