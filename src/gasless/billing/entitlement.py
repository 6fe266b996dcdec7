"""Entitlement on every relay: who pays, by which class, and the per-transaction admission policy.

Order (docs/billing.md):
0. any call to the billing contract while it is paused for it (globally, or deposits for a deposit) is
   CONTRACT_PAUSED before anything else, free or billed;
1. a free operation (a call to the billing contract named in its `free_operations`) is `free`, subject to
   the free-flow limits checked by the service;
2. a sponsor key (`X-Api-Key`, verified by the route) pays for any sender: its account must hold the
   Builder tier or above, its receiver list and tighter limits apply, and token transfers other than
   fungible ESDT (NFT, SFT, Meta-ESDT, multi-token) are refused (SENDER_NOT_AUTHORIZED);
3. otherwise the signed transaction is the credential: the sender's own account, else the account that
   names the sender as an authorised sender; neither is NO_ENTITLEMENT with a PAYMENT-REQUIRED header.
The paying account must not be suspended (ACCOUNT_SUSPENDED); its running plan gives the rate class and
the period cap (`plan`); without a usable plan, pay-as-you-go pays when enabled (`payg`), priced from the
contract's RU price and capped by `max_payg_price` (PAYG_PRICE_ABOVE_MAX). Pay-as-you-go spends the escrow,
plus the credits when auto top-up is on (the contract refills the escrow from them as it settles). A
refusal on this path says what the account holds and the command that lets it relay (billing.advice).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from multiversx_sdk import Transaction

from gasless.billing.advice import Holdings
from gasless.billing.decision import EntitlementDecision
from gasless.billing.policy import FLAG_FUNCTIONS, MAX_DATA_BYTES_SELF_SERVE, AdmissionPolicy
from gasless.billing.schedule import RU_SCHEDULE_V1, ru_for_gas_limit
from gasless.chain.addresses import address_of
from gasless.chain.calls import function_of, transfer_destination
from gasless.core.errors import ApiError
from gasless.mirror.views import ContractMirror

PERIOD_MS = 2_592_000_000  # a plan period: 30 days (the contract's MONTH_MS)
BUILDER_TIER_NAME = b"Builder"
# Token transfers that only the sender's own plan (or a plan naming the sender) may pay for.
NON_FUNGIBLE_TRANSFERS = frozenset({"ESDTNFTTransfer", "MultiESDTNFTTransfer"})
_ZERO = bytes(32)
DEPOSIT_FUNCTIONS = frozenset({"deposit", "depositFor", "depositAndSubscribe"})


def _data_len(tx: Transaction) -> int:
    return len(tx.data or b"")


def period_of(start_ms: int, end_ms: int, now_ms: int) -> int | None:
    """The id of the plan period containing `now_ms`: its start in ms (a block of n months has n periods of
    30 days from its start). None for a block without a period (pay-as-you-go tiers)."""
    if end_ms == 0:
        return None
    elapsed = max(0, now_ms - start_ms)
    return start_ms + (elapsed // PERIOD_MS) * PERIOD_MS


def is_deploy_or_upgrade(tx: Transaction) -> bool:
    receiver = tx.receiver.get_public_key()
    if bytes(receiver) == _ZERO:  # a deployment goes to the zero address
        return True
    return (tx.data or b"").split(b"@", 1)[0] == b"upgradeContract"


class TopupChallenges(Protocol):
    """The x402 top-up challenge NO_ENTITLEMENT carries (gasless.x402.challenges.X402Challenges)."""

    def topup_header(self, payer: str, amount: int, *, error: str) -> str: ...


class BillingEntitlement:
    def __init__(
        self,
        mirror: ContractMirror,
        *,
        challenges: TopupChallenges | None = None,
        policy: AdmissionPolicy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mirror = mirror
        self.challenges = challenges
        self.policy = policy or AdmissionPolicy()
        self.clock = clock

    async def decide(
        self,
        tx: Transaction,
        sender: str,
        sponsor: Any | None,
        *,
        free_allowed: bool = True,
        account: str | None = None,
    ) -> EntitlementDecision:
        contract = self.mirror.contract
        function = function_of(tx)
        ru = _ru_of(tx)
        if contract is not None and tx.receiver.to_bech32() == contract:
            # Every call to the contract, free or billed, stops here while it is paused for it: the call
            # would revert (and with simulation off it would be co-signed and paid for).
            await self._require_open(function, sender)
            config = (await self.mirror.config())[0]
            free_ops = {bytes(name).decode() for name in config.free_operations}
            if function in FLAG_FUNCTIONS and not await self.mirror.has_account(sender):
                # Flag calls are co-signed only for an address with an account of its own (the contract
                # would revert them); renewing another account is a normal, billed relay.
                raise await self._no_entitlement(
                    sender, "NO_ACCOUNT", f"{sender} has no account in the contract: flag calls need one"
                )
            if function in free_ops and free_allowed and not _renews_another(tx, function):
                # A free call is held to the data limit of the sender's account too: the static check
                # lets more through as soon as any account is allow-listed.
                if _data_len(tx) > MAX_DATA_BYTES_SELF_SERVE:
                    paying = await self.mirror.paying_account(sender)
                    self._require_data_size(tx, paying[0] if paying is not None else sender)
                return EntitlementDecision("free", sender, ru=0, function=function or None)
        if contract is None:
            raise await self._no_entitlement(sender, "NO_ACCOUNT", "no billing contract is configured")
        if sponsor is not None:
            return await self._sponsored(tx, sender, sponsor, function, ru)
        paying = await self.mirror.paying_account(sender)
        if account is not None and (paying is None or paying[0] != account):
            # The request names its payer: a sender that account does not name cannot spend its plan.
            raise ApiError(
                "SENDER_NOT_AUTHORIZED",
                detail=f"{sender} is not {account} nor one of its authorised senders; the account adds "
                "it with addSenders, or relay without `account`",
                details={"reason": "not_an_authorised_sender", "account": account},
            )
        if paying is None:
            holdings = Holdings.none(sender, await self._deposit_min())
            raise await self._no_entitlement(
                sender,
                "NO_ACCOUNT",
                f"{holdings.sentence()}, and no account names it as an authorised sender; "
                f"{holdings.advice()}",
                holdings.details(),
            )
        account, _relation = paying
        return await self._account_decision(tx, sender, account, "signed_tx", None, function, ru)

    # Sponsor keys ---------------------------------------------------------------------------------------
    async def _sponsored(
        self, tx: Transaction, sender: str, sponsor: Any, function: str, ru: int
    ) -> EntitlementDecision:
        account = sponsor.account
        policy = sponsor.policy
        receiver = transfer_destination(tx)
        listed = policy.allowedReceivers is not None and receiver in policy.allowedReceivers
        if policy.allowedReceivers is not None and not listed:
            raise ApiError(
                "RECEIVER_NOT_ALLOWED",
                detail=f"this API key does not pay for transactions to {receiver}; add it to the key's "
                "receiver list",
                details={"receiver": receiver, "apiKeyId": sponsor.key_id},
            )
        head = (tx.data or b"").split(b"@", 1)[0].decode("ascii", "replace")
        if head in NON_FUNGIBLE_TRANSFERS and sender != account and not listed:
            # Paid by the sender's own plan or one naming the sender; a sponsor key only for a destination
            # its receiver list names, else RECEIVER_NOT_ALLOWED (docs/billing.md).
            owner_of_sender = await self.mirror.paying_account(sender)
            if owner_of_sender is None or owner_of_sender[0] != account:
                raise ApiError(
                    "RECEIVER_NOT_ALLOWED",
                    detail="NFT, SFT, Meta-ESDT and multi-token transfers are paid by the sender's own plan "
                    f"or a plan naming the sender; for this API key add {receiver} to its receiver list",
                    details={
                        "reason": "token_transfer_needs_own_plan",
                        "receiver": receiver,
                        "apiKeyId": sponsor.key_id,
                    },
                )
        key_limit = policy.limits.maxGasLimit
        if key_limit is not None and tx.gas_limit > key_limit:
            raise ApiError(
                "GAS_LIMIT_TOO_HIGH",
                detail=f"gas limit {tx.gas_limit} is above this API key's ceiling {key_limit}",
                details={"limit": key_limit, "actual": tx.gas_limit},
            )
        return await self._account_decision(tx, sender, account, "api_key", sponsor.key_id, function, ru)

    async def _require_builder(self, account: str, tier_id: int | None) -> None:
        tiers = await self.mirror.tiers()
        classes = await self.mirror.rate_classes()
        builder = next((t for t in tiers.values() if bytes(t.name) == BUILDER_TIER_NAME), None)
        tier = tiers.get(tier_id) if tier_id is not None else None
        if tier is None or builder is None:
            ok = False
        else:
            mine = classes.get(int(tier.rate_class))
            floor = classes.get(int(builder.rate_class))
            ok = mine is not None and floor is not None and int(mine.ru_per_sec) >= int(floor.ru_per_sec)
        if not ok:
            raise ApiError(
                "API_KEY_SCOPE",
                detail="sponsoring other senders needs the Builder tier or above on the key's account",
                details={"reason": "tier_below_builder", "account": account},
            )

    # The paying account --------------------------------------------------------------------------------
    async def _account_decision(
        self,
        tx: Transaction,
        sender: str,
        account: str,
        auth_mode: str,
        api_key_id: str | None,
        function: str,
        ru: int,
    ) -> EntitlementDecision:
        view = await self.mirror.account(account)
        if view is None:
            holdings = Holdings.none(account, await self._deposit_min())
            raise await self._no_entitlement(
                sender, "NO_ACCOUNT", f"{holdings.sentence()}; {holdings.advice()}", holdings.details()
            )
        if view.suspended:
            raise ApiError(
                "ACCOUNT_SUSPENDED",
                detail="the paying account is suspended; nothing was charged or sent (credits are not lost)",
                details={"account": account},
            )
        now = int(self.clock() * 1000)
        running = view.running
        if running is not None and int(running.end_ms) != 0 and int(running.end_ms) <= now:
            running = None  # ended and not renewed: the view's rollover already promoted a queued block
        tier_id = int(running.tier_id) if running is not None else None
        if auth_mode == "api_key":
            await self._require_builder(account, tier_id)
        config = (await self.mirror.config())[0]
        price = int(config.ru_price_micro)
        payg = view.payg
        tiers = await self.mirror.tiers()
        running_tier = tiers.get(tier_id) if tier_id is not None else None
        plan_name: str | None = None
        if running is not None:
            plan_name = (
                bytes(running_tier.name).decode("utf-8", "replace")
                if running_tier is not None
                else f"tier {tier_id}"
            )
        holdings = Holdings(
            account,
            plan_name,
            int(view.credits_micro),
            int(view.escrow_micro),
            bool(payg.enabled),
            bool(payg.auto_topup),
            max(int(config.deposit_min_micro), 1),
        )
        payg_price: int | None = None
        payg_cap: int | None = None
        if bool(payg.enabled):
            payg_price = price
            # With auto top-up the contract refills the escrow from credits when it settles a charge
            # (docs/settlement.md): credits pay as well as the escrow.
            funds = holdings.escrow_micro + (holdings.credits_micro if holdings.auto_topup else 0)
            budget = int(payg.budget_micro)
            payg_cap = min(funds, budget) if budget > 0 else funds
        if running is None:
            payg_tier = next((t for t in tiers.values() if bool(t.payg)), None)
            rate_class = int(payg_tier.rate_class) if payg_tier is not None else None
            if payg_price is None or rate_class is None:
                raise await self._no_entitlement(
                    sender,
                    "NO_PLAN",
                    f"{holdings.sentence()}: credits pay for relays only through the pay-as-you-go escrow; "
                    f"{holdings.advice()}",
                    holdings.details(),
                )
            self._payg_price_ok(payg, payg_price)
            billing_class, period_id, included = "payg", None, None
        else:
            tier = tiers.get(tier_id)  # type: ignore[arg-type]
            rate_class = int(tier.rate_class) if tier is not None else 1
            period_id = period_of(int(running.start_ms), int(running.end_ms), now)
            included = int(running.included_ru) if period_id is not None else None
            if period_id is None:  # a block without a period (a pay-as-you-go tier) pays as it goes
                if payg_price is None:
                    raise await self._no_entitlement(
                        sender,
                        "NO_PLAN",
                        f"{holdings.sentence()}: its plan is pay-as-you-go, which pays only from the escrow; "
                        f"{holdings.advice()}",
                        holdings.details(),
                    )
                self._payg_price_ok(payg, payg_price)
                billing_class = "payg"
            else:
                billing_class = "plan"
        classes = await self.mirror.rate_classes()
        limits = classes.get(rate_class)
        if limits is not None and tx.gas_limit > int(limits.max_gas_limit):
            raise ApiError(
                "GAS_LIMIT_TOO_HIGH",
                detail=f"gas limit {tx.gas_limit} is above rate class {rate_class}'s ceiling "
                f"{int(limits.max_gas_limit)}",
                details={"limit": int(limits.max_gas_limit), "actual": tx.gas_limit},
            )
        self._require_data_size(tx, account)
        if is_deploy_or_upgrade(tx) and account not in self.policy.deploy_allowlist:
            raise ApiError(
                "DEPLOY_NOT_ALLOWED",
                detail="deployments and upgrades are not relayed for this account unless allow-listed",
                details={"account": account},
            )
        if auth_mode == "api_key" and billing_class == "plan":
            billing_class = "sponsor"
        # A payg fallback is priced only if pay-as-you-go may pay (price under the account's cap).
        if payg_price is not None and not self._payg_price_fits(payg, payg_price):
            payg_price = None
        return EntitlementDecision(
            billing_class,
            account,
            auth_mode,
            ru=ru,
            rate_class=rate_class,
            period_id=period_id if billing_class in ("plan", "sponsor") else None,
            included_ru=included if billing_class in ("plan", "sponsor") else None,
            payg_price_micro=payg_price,
            payg_cap_micro=payg_cap,
            api_key_id=api_key_id,
            function=function or None,
            holdings=holdings.as_json(),
        )

    @staticmethod
    def _payg_price_fits(payg: Any, price: int) -> bool:
        cap = int(payg.max_payg_price_micro)
        return cap == 0 or price <= cap

    def _payg_price_ok(self, payg: Any, price: int) -> None:
        if not self._payg_price_fits(payg, price):
            raise payg_price_above_max(price, int(payg.max_payg_price_micro))

    async def _deposit_min(self) -> int:
        return max(int((await self.mirror.config())[0].deposit_min_micro), 1)

    def _require_data_size(self, tx: Transaction, account: str) -> None:
        """At most 4 096 bytes of data unless the account is allow-listed. Reached only when some account is
        allow-listed (else the static check refused it first), on every path: free, sponsored, billed."""
        if _data_len(tx) > MAX_DATA_BYTES_SELF_SERVE and account not in self.policy.data_allowlist:
            raise ApiError(
                "DATA_TOO_LARGE",
                detail=f"data is {_data_len(tx)} bytes; at most {MAX_DATA_BYTES_SELF_SERVE} on a self-serve "
                "account (more only by allow-list)",
                details={"limit": MAX_DATA_BYTES_SELF_SERVE, "actual": _data_len(tx), "account": account},
            )

    async def _no_entitlement(
        self, sender: str, reason: str, detail: str, details: dict[str, Any] | None = None
    ) -> ApiError:
        """NO_ENTITLEMENT with a complete x402 challenge for a top-up of the transaction's sender (the deposit
        minimum), never for a sponsor key's account. `details` adds what the account holds
        (billing.advice)."""
        headers: dict[str, str] = {}
        if self.challenges is not None:
            amount = await self._deposit_min()
            headers["PAYMENT-REQUIRED"] = self.challenges.topup_header(sender, amount, error="NO_ENTITLEMENT")
        return ApiError(
            "NO_ENTITLEMENT", detail=detail, details={**(details or {}), "reason": reason}, headers=headers
        )

    async def _require_open(self, function: str, sender: str) -> None:
        """A call to the contract is answered before any co-signature when it cannot work: the contract
        paused for it (CONTRACT_PAUSED), or a deposit while the exchange venue is paused (SWAP_VENUE_PAUSED:
        a deposit swaps its gas share there). Both read now, not from a cache: a pause set a moment ago must
        stop the call before the co-signature (such calls are rare; their refusal must be exact)."""
        pause = (await self.mirror.fresh("getPauseState"))[0]
        if not (pause.paused or (pause.deposits_paused and function in DEPOSIT_FUNCTIONS)):
            if function in DEPOSIT_FUNCTIONS and not await self.mirror.venue_open(fresh=True):
                raise ApiError(
                    "SWAP_VENUE_PAUSED",
                    detail="the exchange venue is paused: deposits and purchases wait; nothing was charged or "
                    "sent (relaying on an existing plan is unaffected)",
                    details={"retryAfterMs": 30_000},
                )
            return
        if sender == await self.mirror.owner():
            return
        scope = "global" if pause.paused else "deposits"
        raise ApiError(
            "CONTRACT_PAUSED",
            detail=f"the contract is paused ({scope}); nothing was charged or sent",
            details={"scope": scope, "retryAfterMs": 30_000},
        )


def payg_price_above_max(price: int, cap: int) -> ApiError:
    return ApiError(
        "PAYG_PRICE_ABOVE_MAX",
        detail=f"the pay-as-you-go price {price} micro-USDC per RU is above the account's max_payg_price {cap}",
        details={"priceMicro": price, "maxPaygPriceMicro": cap},
    )


def _ru_of(tx: Transaction) -> int:
    # Above the schedule's last step the transaction is refused elsewhere (GAS_LIMIT_TOO_HIGH); price it
    # at the last step meanwhile.
    try:
        return ru_for_gas_limit(tx.gas_limit)
    except ValueError:
        return RU_SCHEDULE_V1[-1][1]


def bech32_of(raw: Any) -> str:
    return address_of(bytes(raw)).to_bech32()


def _renews_another(tx: Transaction, function: str) -> bool:
    """`renew(address)` for an account other than the signer's: free only for oneself (docs/billing.md,
    "Free flow")."""
    if function != "renew":
        return False
    parts = bytes(tx.data).split(b"@")
    try:
        target = bytes.fromhex(parts[1].decode("ascii")) if len(parts) > 1 else b""
    except ValueError:
        return True
    return target != tx.sender.get_public_key()
