"""The purchase builders (spec: Purchase builders, rules 1-4): what to sign to buy a plan, deposit, change
the account's flags or its authorised senders, checked against the contract's views before anything is built.

Every refusal the contract would make is answered here with the catalogue's code, so a user never signs a
transaction that is bound to revert: pauses (CONTRACT_PAUSED, SWAP_VENUE_PAUSED), bounds (DEPOSIT_BELOW_MIN,
DEPOSIT_ABOVE_MAX, SWAP_BUDGET_EXHAUSTED), the plan rules (TIER_NOT_PURCHASABLE, QUEUED_BLOCK_EXISTS,
DOWNGRADE_NOT_IMMEDIATE, INSUFFICIENT_CREDITS, PRICE_ABOVE_MAX).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from multiversx_sdk import Address

from gasless.billing.entitlement import payment_required_header
from gasless.billing.schedule import ru_for_gas_limit
from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.errors import ApiError
from gasless.mirror.views import ContractMirror
from gasless.pricing.service import text
from gasless.purchases.builder import Call, CallBuilder
from gasless.purchases.quotes import QuoteSigner, SignedQuote
from gasless.purchases.schemas import (
    PrepareDepositRequest,
    PreparedPurchase,
    PreparedTransaction,
    PrepareSubscribeRequest,
    PurchaseQuote,
)

DAY_MS = 86_400_000  # the contract's swap budget window
BPS = 10_000


def purchase_terms(payer: str, tier_id: int, months: int, price: int) -> dict[str, Any]:
    """What a plan quote binds (amounts as strings: RFC 8785 would print large integers as floats)."""
    return {
        "kind": "plan_purchase",
        "payer": payer,
        "tierId": tier_id,
        "months": months,
        "priceMicroUsdc": str(price),
    }


class PurchaseService:
    def __init__(
        self,
        mirror: ContractMirror,
        builder: CallBuilder,
        quotes: QuoteSigner,
        *,
        base_url: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mirror = mirror
        self.builder = builder
        self.quotes = quotes
        self.base_url = base_url
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # Views ----------------------------------------------------------------------------------------------
    async def _read(self, function: str, args: list[bytes] | None = None) -> list[Any]:
        try:
            return await self.mirror.fresh(function, args)
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError(
                "UPSTREAM_UNAVAILABLE",
                detail="the billing contract could not be read; nothing was built",
                details={"retryAfterMs": 1_000},
            ) from exc

    async def config(self) -> Any:
        return (await self._read("getConfig"))[0]

    async def account_view(self, address: str) -> Any | None:
        pubkey = Address.new_from_bech32(address).get_public_key()
        return (await self._read("getAccount", [pubkey]))[0]

    async def tiers(self) -> dict[int, Any]:
        views = await self._read("getTiers")
        items = views[0] if len(views) == 1 and isinstance(views[0], list) else views
        return {int(tier.id): tier for tier in items}

    async def require_open(self, *, deposit: bool) -> None:
        """CONTRACT_PAUSED (global, or deposits for a deposit), then SWAP_VENUE_PAUSED for a deposit."""
        pause = (await self._read("getPauseState"))[0]
        if pause.paused or (deposit and pause.deposits_paused):
            scope = "global" if pause.paused else "deposits"
            raise ApiError(
                "CONTRACT_PAUSED",
                detail=f"the contract is paused ({scope}); nothing was built",
                details={"scope": scope, "retryAfterMs": 30_000},
            )
        if deposit:
            try:
                open_ = await self.mirror.venue_open()
            except (GatewayUnavailable, GatewayRejected) as exc:
                raise ApiError("UPSTREAM_UNAVAILABLE", detail="the exchange venue could not be read") from exc
            if not open_:
                raise ApiError(
                    "SWAP_VENUE_PAUSED",
                    detail="the exchange venue is paused: deposits and purchases wait; nothing was built",
                    details={"retryAfterMs": 30_000},
                )

    @staticmethod
    def free_operations(config: Any) -> set[str]:
        return {text(name) for name in config.free_operations}

    # Deposits --------------------------------------------------------------------------------------------
    def check_deposit(self, config: Any, amount: int) -> None:
        """The contract's deposit bounds and its rolling swap budget (the deposit's gas share is swapped)."""
        minimum, maximum = int(config.deposit_min_micro), int(config.deposit_max_micro)
        if amount < minimum:
            raise ApiError(
                "DEPOSIT_BELOW_MIN",
                detail=f"a deposit is at least {minimum} micro-USDC",
                details={"minMicroUsdc": minimum, "amountMicroUsdc": amount},
            )
        if maximum and amount > maximum:
            raise ApiError(
                "DEPOSIT_ABOVE_MAX",
                detail=f"a deposit is at most {maximum} micro-USDC",
                details={"maxMicroUsdc": maximum, "amountMicroUsdc": amount},
            )
        share = amount * int(config.swap_share_bps) // BPS
        budget = int(config.swap_budget_micro)
        if share and budget:
            now = self.now_ms()
            start = int(config.swap_window_start_ms)
            spent = int(config.swap_window_spent_micro) if now < start + DAY_MS else 0
            if spent + share > budget:
                retry = max(1_000, start + DAY_MS - now)
                raise ApiError(
                    "SWAP_BUDGET_EXHAUSTED",
                    detail="the rolling swap budget for deposits is used up; retry when the window turns",
                    details={"retryAfterMs": retry},
                )

    async def prepare_deposit(self, request: PrepareDepositRequest) -> PreparedTransaction:
        await self.require_open(deposit=True)
        config = await self.config()
        self.check_deposit(config, request.amountMicroUsdc)
        beneficiary = request.beneficiary
        if beneficiary is None or beneficiary == request.payer:
            call = Call("deposit", [], [], payment_amount=request.amountMicroUsdc)
        else:
            call = Call(
                "depositFor",
                [Address.new_from_bech32(beneficiary)],
                [beneficiary],
                payment_amount=request.amountMicroUsdc,
            )
        free = call.function in self.free_operations(config)
        prepared, _ = await self.builder.build(request.payer, [call], kinds=[(free, None)])
        return self._priced(prepared[0])

    # Plans ------------------------------------------------------------------------------------------------
    async def prepare_subscribe(self, request: PrepareSubscribeRequest) -> PreparedPurchase:
        tiers = await self.tiers()
        tier = tiers.get(request.tierId)
        if tier is None or not bool(tier.purchasable):
            raise ApiError(
                "TIER_NOT_PURCHASABLE",
                detail=f"tier {request.tierId} cannot be bought now (see `available` in GET /v1/pricing)",
                details={"tierId": request.tierId},
            )
        price = int(tier.price_micro) * request.months
        if request.maxPriceMicroUsdc is not None and price > request.maxPriceMicroUsdc:
            raise ApiError(
                "PRICE_ABOVE_MAX",
                detail=f"the price is {price} micro-USDC, above the {request.maxPriceMicroUsdc} asked for",
                details={"priceMicroUsdc": price, "maxPriceMicroUsdc": request.maxPriceMicroUsdc},
            )
        account = await self.account_view(request.payer)
        credits = int(account.credits_micro) if account is not None else 0
        self._check_placement(account, tier, tiers)
        pay_with = request.payWith
        if pay_with == "auto":
            pay_with = "credits" if credits >= price else "usdc"
        if pay_with == "credits" and credits < price:
            raise ApiError(
                "INSUFFICIENT_CREDITS",
                detail=f"the account's credits ({credits} micro-USDC) do not cover the price ({price}); top "
                "up, or pay with USDC",
                details={"creditsMicroUsdc": credits, "priceMicroUsdc": price},
                headers={
                    "PAYMENT-REQUIRED": payment_required_header(
                        request.payer,
                        chain_id=self.quotes.keys.chain_id,
                        base_url=self.base_url,
                        payment_token=self.builder.payment_token,
                    )
                },
            )
        deposit = 0
        config = await self.config()
        if pay_with == "usdc":
            # depositAndSubscribe deposits what is attached, then pays the price from credits.
            deposit = max(price - credits, int(config.deposit_min_micro), 1)
            await self.require_open(deposit=True)
            self.check_deposit(config, deposit)
        else:
            await self.require_open(deposit=False)
        quote = self.quotes.sign(purchase_terms(request.payer, request.tierId, request.months, price))
        function = "depositAndSubscribe" if pay_with == "usdc" else "subscribe"
        call = Call(
            function,
            [request.tierId, request.months, price, quote.ref],
            [request.tierId, request.months, str(price), quote.quote_id],
            payment_amount=deposit,
        )
        free = function in self.free_operations(config)
        prepared, assignment = await self.builder.build(request.payer, [call], kinds=[(free, None)])
        one = self._priced(prepared[0])
        return PreparedPurchase(
            quote=self.purchase_quote(quote, request.payer, request.tierId, request.months, price),
            transaction=one.transaction,
            assignment=assignment,
            contractCall=one.contractCall,
            free=one.free,
            ru=one.ru,
            feeMicroUsdc=0,
            payWith=pay_with,
        )

    def purchase_quote(
        self, quote: SignedQuote, payer: str, tier_id: int, months: int, price: int
    ) -> PurchaseQuote:
        return PurchaseQuote(
            quoteId=quote.quote_id,
            quoteMac=quote.mac,
            payer=payer,
            tierId=tier_id,
            months=months,
            priceMicroUsdc=str(price),
            maxPrice=str(price),
            chainId=self.quotes.keys.chain_id,
            bucket=quote.bucket,
            expiresAtMs=quote.expires_at_ms,
        )

    def _check_placement(self, account: Any | None, tier: Any, tiers: dict[int, Any]) -> None:
        """Where the contract would place the block (its _place_block): refused as it would refuse."""
        running = account.running if account is not None else None
        now = self.now_ms()
        if running is None or int(running.end_ms) == 0 or int(running.end_ms) <= now:
            return  # starts now
        if int(tier.period_ms) == 0:
            raise ApiError(
                "DOWNGRADE_NOT_IMMEDIATE",
                detail="a plan without a period cannot start while a period plan runs; buy it once the "
                "running plan has ended",
                details={"runningTierId": int(running.tier_id), "endsAtMs": int(running.end_ms)},
            )
        running_tier = tiers.get(int(running.tier_id))
        if int(tier.price_micro) > (int(running_tier.price_micro) if running_tier is not None else 0):
            return  # an upgrade: starts now, a queued block is credited back
        if account is not None and account.queued is not None:
            raise ApiError(
                "QUEUED_BLOCK_EXISTS",
                detail="a plan is already queued behind the running one; a more expensive tier takes effect "
                "now and credits the queued block back",
                details={
                    "queuedTierId": int(account.queued.tier_id),
                    "startsAtMs": int(account.queued.start_ms),
                },
            )

    @staticmethod
    def _priced(prepared: PreparedTransaction) -> PreparedTransaction:
        """A billed call says what its relay costs in RU (the RU schedule of its gas limit)."""
        if prepared.free or prepared.ru is not None:
            return prepared
        return prepared.model_copy(update={"ru": ru_for_gas_limit(prepared.transaction.gasLimit)})
