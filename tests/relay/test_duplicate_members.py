"""A JSON member repeated in a request body, at any depth, is refused on every route (400 MALFORMED_REQUEST,
`details.field` naming it): no route picks one of the values (Python's `json` keeps the last one)."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

JSON = {"Content-Type": "application/json"}


def gateway(env: Any, path: str) -> Any:
    with urllib.request.urlopen(f"{env.localnet.url}{path}", timeout=5) as answer:
        return json.loads(answer.read())["data"]


def members(*pairs: tuple[str, Any]) -> str:
    """A JSON object with exactly these members, in this order, repeated names included."""
    return (
        "{"
        + ", ".join(
            f"{json.dumps(name)}: {value if isinstance(value, Raw) else json.dumps(value)}"
            for name, value in pairs
        )
        + "}"
    )


class Raw(str):
    """JSON text inserted as it is (a nested object with its own repeated members)."""


def post_raw(env: Any, path: str, text: str, **headers: str) -> Any:
    return env.client.post(path, content=text.encode(), headers={**JSON, **headers})


def nothing_sent(env: Any, address: str) -> None:
    """The refused body left no trace on the network or in the service: an error answer comes before the
    commit point, the body was never read far enough to name a slot, the account nonce is 0, the pool empty."""
    assert env.client.get(f"/v1/relay/{address}:0").status_code == 404
    assert int(gateway(env, f"/address/{address}/nonce")["nonce"]) == 0
    assert gateway(env, f"/transaction/pool?by-sender={address}&fields=hash")["txPool"]["transactions"] == []


def test_a_relay_body_with_two_tx_members_is_refused_and_nothing_is_sent(env: Any, problem: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    good = env.build(sender, assignment)
    bad = env.build(sender, assignment, gas_price=999_999_999)  # below the network minimum
    cases = [
        (members(("tx", bad.to_dictionary()), ("tx", good.to_dictionary()), ("lease", assignment["lease"]))),
        (members(("tx", good.to_dictionary()), ("lease", "x.y"), ("lease", assignment["lease"]))),
        (
            members(
                ("tx", Raw(members(*[(k, v) for k, v in good.to_dictionary().items()], ("nonce", 0)))),
                ("lease", assignment["lease"]),
            )
        ),
    ]
    fields = ["tx", "lease", "tx.nonce"]
    for text, field in zip(cases, fields, strict=True):
        for path in ("/v1/relay", "/v1/validate"):
            refused = problem(post_raw(env, path, text), "MALFORMED_REQUEST")
            assert refused["details"] == {"field": field}, refused
            assert "more than once" in refused["detail"]
    nothing_sent(env, sender.address)
    # The same transaction, once, is relayed: the refusal was the repetition, not the transaction.
    relayed = env.relay(good, assignment["lease"])
    assert relayed.status_code in (200, 202), relayed.text


def test_a_repeated_member_is_refused_on_every_route_with_a_json_body(
    env: Any, problem: Any, subtests: Any
) -> None:
    """Every operation of the document that takes a body, whatever its credentials: the body is judged
    before anything else reads it."""
    document = env.client.get("/openapi.json").json()
    address = env.new_sender(1, plan=False).address
    values = {"erd": address, "keyId": "k" * 16, "webhookId": "wh_unknown"}
    routes = [
        (method, path)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if "requestBody" in operation
    ]
    assert len(routes) >= 9, routes
    nested = members(
        ("label", "a"),
        ("policy", Raw(members(("limits", Raw(members(("ruPerSecond", 1), ("ruPerSecond", 2))))))),
    )
    for method, template in routes:
        path = re.sub(r"{(\w+)}", lambda m: values[m.group(1)], template)
        for text, field in (
            (members(("account", address), ("account", address)), "account"),
            (nested, "policy.limits.ruPerSecond"),
        ):
            with subtests.test(route=f"{method.upper()} {template}", field=field):
                answer = env.client.request(method.upper(), path, content=text.encode(), headers=JSON)
                assert problem(answer, "MALFORMED_REQUEST")["details"] == {"field": field}


def test_a_repeated_member_inside_an_array_is_named_by_its_index(env: Any, problem: Any) -> None:
    text = members(
        ("tx", Raw(members(("data", ""), ("data", "")))), ("variants", Raw('[{}, {"a": 1, "a": 2}]'))
    )
    assert problem(post_raw(env, "/v1/relay", text), "MALFORMED_REQUEST")["details"] == {"field": "tx.data"}
    array = members(("tx", Raw("{}")), ("lease", Raw('[{}, {"a": 1, "a": 2}]')))
    assert problem(post_raw(env, "/v1/relay", array), "MALFORMED_REQUEST")["details"] == {
        "field": "lease.1.a"
    }


def test_non_json_constants_are_malformed(env: Any, problem: Any) -> None:
    for constant in ("NaN", "Infinity", "-Infinity"):
        for path in ("/v1/relay", "/v1/quote"):
            text = members(("tx", Raw(members(("nonce", Raw(constant))))))
            assert problem(post_raw(env, path, text), "MALFORMED_REQUEST")["details"] == {"field": "body"}
