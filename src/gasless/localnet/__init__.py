"""localnet: a simulated sharded MultiversX network behind the real gateway REST API."""
