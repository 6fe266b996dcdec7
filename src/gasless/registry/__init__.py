"""The public relayer registry: address, shard, state (the contract's) and history, service statistics."""
