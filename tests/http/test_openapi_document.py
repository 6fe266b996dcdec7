"""docs/openapi.json is exactly the document the app serves at `GET /openapi.json` (a mainnet host's).

The committed copy is the contract a reader sees without running a host; it is generated, never edited by
hand. When this fails, run the command in the message and commit the file with the change that moved it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "openapi_document.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_document", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def differences(expected: Any, actual: Any, at: str = "") -> list[str]:
    """Where two JSON values differ, as JSON pointers (the first few are enough to see what moved)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = []
        for key in sorted(expected.keys() | actual.keys()):
            pointer = f"{at}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key not in actual:
                found.append(f"{pointer}: only in the committed copy")
            elif key not in expected:
                found.append(f"{pointer}: only in the served document")
            else:
                found += differences(expected[key], actual[key], pointer)
        return found
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        pairs = enumerate(zip(expected, actual, strict=True))
        return [line for i, (e, a) in pairs for line in differences(e, a, f"{at}/{i}")]
    return [] if expected == actual else [f"{at or '/'}: differs"]


def test_committed_document_is_what_the_app_serves() -> None:
    tool = load_tool()
    assert tool.DOCUMENT.exists(), f"{tool.DOCUMENT.relative_to(ROOT)} is missing; run: {tool.REGENERATE}"
    committed_text = tool.DOCUMENT.read_text(encoding="utf-8")
    served = tool.served_document()
    found = differences(json.loads(committed_text), served)
    shown = "\n  ".join(found[:20]) + (f"\n  ... and {len(found) - 20} more" if len(found) > 20 else "")
    assert not found, (
        f"docs/openapi.json differs from what the app serves at /openapi.json:\n  {shown}\n"
        f"Regenerate it with `{tool.REGENERATE}` and commit it with the change."
    )
    # Same members, same values: the text must also be the tool's rendering (member order, indent), so the
    # file is only ever written by the tool and a regenerated copy diffs cleanly.
    assert committed_text == tool.render(served), (
        f"docs/openapi.json holds the served document but not as the tool writes it (member order or layout); "
        f"regenerate it with `{tool.REGENERATE}`."
    )


def test_the_copy_is_a_mainnet_hosts() -> None:
    document = json.loads(load_tool().DOCUMENT.read_text(encoding="utf-8"))
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]
    for name in ("Transaction", "SignedTransaction"):
        assert schemas[name]["properties"]["chainID"]["const"] == "1", name
