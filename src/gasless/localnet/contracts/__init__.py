"""Contract models executed by localnet: the billing contract and the exchange venue (pair, wrapper)."""

from gasless.localnet.contracts.billing import BILLING_GAS, BillingContract
from gasless.localnet.contracts.seed import seed_config
from gasless.localnet.contracts.venue import LOCALNET_WEGLD_TOKEN, PairContract, WrapperContract

__all__ = [
    "BILLING_GAS",
    "LOCALNET_WEGLD_TOKEN",
    "BillingContract",
    "PairContract",
    "WrapperContract",
    "seed_config",
]
