"""Pricing: the pricing document (`GET /v1/pricing`) and the tariff history, built from the billing contract's
views (the contract is the authority; these are its published face)."""
