"""x402 v2: the service as its own facilitator (challenges, payment records, settlement through the relay core)."""
