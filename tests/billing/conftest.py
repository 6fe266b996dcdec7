"""Billing path tests reuse the auth tests' fixtures: the relay suite's app on a real localnet (`env`,
`make_env`, `problem`) and `auth` (native-auth tokens, API keys through HTTP)."""

from __future__ import annotations

from relay_kit import load_conftest

_auth = load_conftest("auth")
env = _auth.env
make_env = _auth.make_env
unpaused_localnet = _auth.unpaused_localnet
problem = _auth.problem
auth = _auth.auth
platform_problem = _auth.platform_problem
auth_for = _auth.auth_for
