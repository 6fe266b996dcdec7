"""Limits tests: the relay suite's app on a real localnet (`env`) for the live checks."""

from __future__ import annotations

from relay_kit import load_conftest  # type: ignore[import-not-found]

relay_env = load_conftest("relay")
env = relay_env.env
unpaused_localnet = relay_env.unpaused_localnet
