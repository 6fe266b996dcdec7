"""Billing path tests reuse the auth tests' fixtures: the relay suite's app on a real localnet (`env`,
`make_env`, `problem`) and `auth` (native-auth tokens, API keys through HTTP)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _load(name: str, path: Path) -> ModuleType:
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


_auth = _load("gasless_tests_auth_kit", Path(__file__).resolve().parents[1] / "auth" / "conftest.py")
env = _auth.env
make_env = _auth.make_env
unpaused_localnet = _auth.unpaused_localnet
problem = _auth.problem
auth = _auth.auth
platform_problem = _auth.platform_problem
auth_for = _auth.auth_for
