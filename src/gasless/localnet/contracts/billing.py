"""The billing contract model: the on-chain authority for plans, credits, flags, rate classes, pauses.

Interface: `gasless/chain/abi/billing.abi.json`; arguments, results and events go through the SDK's ABI
codec with that file. Amounts are micro-USDC, times block timestamps in ms.

Rules worth knowing (each endpoint documents its own):
- Deposit checks, in order: ERR_PAUSED, ERR_DEPOSITS_PAUSED, ERR_BAD_PAYMENT_TOKEN, ERR_DEPOSIT_BELOW_MIN,
  ERR_DEPOSIT_ABOVE_MAX, ERR_SWAP_BUDGET_EXHAUSTED. Then `swap_share_bps` of the payment is swapped to WEGLD
  on the pair, unwrapped and sent to the gas tank as EGLD (a failing pair, e.g. ERR_SWAP_VENUE_PAUSED,
  reverts the whole deposit); the account is credited the full amount.
- Purchase checks, in order: ERR_PAUSED, ERR_UNKNOWN_TIER, ERR_TIER_NOT_PURCHASABLE, ERR_BAD_MONTHS,
  ERR_PRICE_ABOVE_MAX, ERR_ACCOUNT_SUSPENDED, placement (ERR_DOWNGRADE_NOT_IMMEDIATE,
  ERR_QUEUED_BLOCK_EXISTS), ERR_INSUFFICIENT_CREDITS (counting a queued block an upgrade credits back).
- An upgrade replaces the running block at once without proration: its remaining time is forfeited.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gasless.chain.abi import BILLING_ABI_PATH
from gasless.chain.addresses import address_of
from gasless.localnet.contracts.billing_owner import OwnerEndpoints
from gasless.localnet.contracts.billing_state import BillingConfig, BillingState, RelayerInfo
from gasless.localnet.contracts.billing_user import UserEndpoints
from gasless.localnet.contracts.billing_views import Views

# Processing gas per endpoint. These model typical costs of the compiled contract (storage reads and
# writes, events; the deposits include the synchronous swap and unwrap calls); they depend on the
# function only, so a quote made before signing stays exact.
BILLING_GAS: dict[str, int] = {
    "deposit": 6_000_000,
    "depositFor": 6_000_000,
    "depositAndSubscribe": 8_000_000,
    "subscribe": 4_000_000,
    "setAutoRenew": 2_000_000,
    "setPayg": 3_000_000,
    "releaseEscrow": 2_500_000,
    "renew": 4_000_000,
    "addSenders": 5_000_000,
    "removeSenders": 3_500_000,
    "grant": 4_000_000,
    "settleUsage": 15_000_000,
    "setPaused": 2_000_000,
    "setDepositsPaused": 2_000_000,
    "setTier": 4_000_000,
    "setRateClass": 4_000_000,
    "setDepositBounds": 3_000_000,
    "setSenderFeeRu": 3_000_000,
    "setRuPrice": 3_000_000,
    "setFreeOperations": 3_500_000,
    "setSwapConfig": 3_000_000,
    "setRelayerState": 3_000_000,
    "setAccountSuspended": 3_000_000,
}
VIEW_GAS = 2_000_000

_ADDRESS_FIELDS = frozenset({"owner", "pair", "wrapper", "gas_tank", "relayer", "account", "address"})


class BillingContract(UserEndpoints, OwnerEndpoints, Views):
    """The billing contract, deployed paused."""

    abi_file = BILLING_ABI_PATH
    gas_table = BILLING_GAS
    default_gas = VIEW_GAS

    def __init__(
        self, owner: bytes, payment_token: str, pair: bytes, wrapper: bytes, gas_tank: bytes, wegld_token: str
    ) -> None:
        super().__init__()
        self.state = BillingState(
            config=BillingConfig(
                owner=owner,
                payment_token=payment_token,
                wegld_token=wegld_token,
                pair=pair,
                wrapper=wrapper,
                gas_tank=gas_tank,
            )
        )

    # Outside transactions (genesis, localnet admin API) -------------------------------------------
    def set_relayer_active(self, relayer: bytes, now_ms: int) -> None:
        """Register `relayer` as active (genesis)."""
        self.state.relayers[relayer] = RelayerInfo(relayer, "Active", now_ms)

    def set_paused(self, paused: bool) -> None:
        self.state.pause.paused = paused

    def set_deposits_paused(self, paused: bool) -> None:
        self.state.pause.deposits_paused = paused

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture of the storage (addresses in bech32, other bytes in hex)."""
        s = self.state
        return {
            "name": self.name,
            "config": _json(asdict(s.config)),
            "pause": asdict(s.pause),
            "tiers": [_json(asdict(t)) for _, t in sorted(s.tiers.items())],
            "rateClasses": [asdict(rc) for _, rc in sorted(s.rate_classes.items())],
            "tariffHistory": [asdict(e) for e in s.tariff_history],
            "relayers": [_json(asdict(r)) for r in s.relayers.values()],
            "accounts": {
                address_of(k).to_bech32(): {
                    **_json(asdict(a)),
                    "senders": [address_of(x).to_bech32() for x in s.senders.get(k, ())],
                }
                for k, a in s.accounts.items()
            },
            "settlements": [_json(asdict(b)) for _, b in sorted(s.settlements.items())],
        }


def _json(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _json(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v, key) for v in value]
    if isinstance(value, bytes):
        if key in _ADDRESS_FIELDS and len(value) == 32:
            return address_of(value).to_bech32()
        if key == "name":
            return value.decode("utf-8", errors="replace")
        return value.hex()
    return value
