"""Usage ledger reads: GET /v1/usage, /v1/usage/{txHash}, /v1/usage/summary."""
