"""API-key tests reuse the auth tests' fixtures (which reuse the relay suite's app on a real localnet)."""

from __future__ import annotations

from relay_kit import load_conftest

_auth = load_conftest("auth")
env = _auth.env
make_env = _auth.make_env
unpaused_localnet = _auth.unpaused_localnet
problem = _auth.problem
auth = _auth.auth
auth_for = _auth.auth_for
platform_problem = _auth.platform_problem
