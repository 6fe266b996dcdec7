"""The purchase builders (docs/purchases.md, "The builders"): what to sign to buy a plan, deposit, change
the account's flags or its authorised senders, checked against the contract's views before anything is built.

Every refusal the contract would make is answered here with the catalogue's code, so a user never signs a
transaction that is bound to revert: pauses (CONTRACT_PAUSED, SWAP_VENUE_PAUSED), bounds (DEPOSIT_BELOW_MIN,
DEPOSIT_ABOVE_MAX, SWAP_BUDGET_EXHAUSTED), the plan rules (TIER_NOT_PURCHASABLE, QUEUED_BLOCK_EXISTS,
DOWNGRADE_NOT_IMMEDIATE, INSUFFICIENT_CREDITS, PRICE_ABOVE_MAX).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from multiversx_sdk import Address, Transaction

from gasless.billing.advice import usdc
from gasless.billing.policy import FLAG_FUNCTIONS
from gasless.billing.schedule import ru_for_gas_limit
from gasless.chain.codec import tx_from_wire
from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.core.errors import ApiError
from gasless.mirror.views import ContractMirror
from gasless.pricing.service import text
from gasless.purchases.builder import Call, CallBuilder
from gasless.purchases.quotes import QuoteSigner, SignedQuote
from gasless.purchases.schemas import (
    PrepareDepositRequest,
    PreparedPurchase,
    PreparedTransaction,
    PreparedTransactions,
    PrepareFlagsRequest,
    PrepareSendersRequest,
    PrepareSubscribeRequest,
    PurchaseQuote,
)

DAY_MS = 86_400_000  # the contract's swap budget window
RENEW_WINDOW_MS = DAY_MS  # the contract's: renew() applies once the running block ends within a day
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


class PurchaseChallenges(Protocol):
    """The x402 challenge a refusal points at (gasless.x402.challenges.X402Challenges)."""

    def purchase_header(
        self, payer: str, tier_id: int, months: int, price: int, amount: int, *, error: str
    ) -> str: ...

    def topup_header(self, payer: str, amount: int, *, error: str) -> str: ...


class PurchaseService:
    def __init__(
        self,
        mirror: ContractMirror,
        builder: CallBuilder,
        quotes: QuoteSigner,
        *,
        challenges: PurchaseChallenges | None = None,
        flag_calls: Callable[[str], Awaitable[tuple[int, int, int]]] | None = None,
        billable: Callable[[Transaction, str], Awaitable[bool]] | None = None,
        flag_limits: tuple[int, int] = (10, 30),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mirror = mirror
        self.builder = builder
        self.quotes = quotes
        self.challenges = challenges
        # The account's free flag calls in 24 h and 30 days and when one is free again (billing/gate), and
        # whether a call past them can be billed.
        self.flag_calls = flag_calls
        self.billable = billable
        self.flag_limits = flag_limits  # free flag calls per 24 h and per 30 days
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

    async def require_open(self, *, deposit: bool, fresh: bool = False) -> None:
        """CONTRACT_PAUSED (global, or deposits for a deposit), then SWAP_VENUE_PAUSED for a deposit (`fresh`:
        the venue read now, as before a co-signature)."""
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
                open_ = await self.mirror.venue_open(fresh=fresh)
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
                detail=f"a deposit is at least {usdc(minimum)} USDC ({minimum} micro-USDC); this one is "
                f"{usdc(amount)} USDC",
                details={"minMicroUsdc": minimum, "amountMicroUsdc": amount},
            )
        if maximum and amount > maximum:
            raise ApiError(
                "DEPOSIT_ABOVE_MAX",
                detail=f"a deposit is at most {usdc(maximum)} USDC ({maximum} micro-USDC); this one is "
                f"{usdc(amount)} USDC",
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
    async def plan_price(
        self, payer: str, tier_id: int, months: int, max_price: int | None = None
    ) -> tuple[int, Any | None]:
        """The price of `months` of tier `tier_id` for `payer`, refused as the contract would refuse the
        purchase (TIER_NOT_PURCHASABLE, PRICE_ABOVE_MAX, the placement rules); with the payer's account."""
        tiers = await self.tiers()
        tier = tiers.get(tier_id)
        if tier is None or not bool(tier.purchasable):
            raise ApiError(
                "TIER_NOT_PURCHASABLE",
                detail=f"tier {tier_id} cannot be bought now (see `available` in GET /v1/pricing)",
                details={"tierId": tier_id},
            )
        price = int(tier.price_micro) * months
        if max_price is not None and price > max_price:
            raise ApiError(
                "PRICE_ABOVE_MAX",
                detail=f"the price is {usdc(price)} USDC ({price} micro-USDC), above the {usdc(max_price)} "
                f"USDC ({max_price} micro-USDC) asked for",
                details={"priceMicroUsdc": price, "maxPriceMicroUsdc": max_price},
            )
        account = await self.account_view(payer)
        self._check_placement(account, tier, tiers)
        return price, account

    async def prepare_subscribe(self, request: PrepareSubscribeRequest) -> PreparedPurchase:
        price, account = await self.plan_price(
            request.payer, request.tierId, request.months, request.maxPriceMicroUsdc
        )
        credits = int(account.credits_micro) if account is not None else 0
        pay_with = request.payWith
        if pay_with == "auto":
            pay_with = "credits" if credits >= price else "usdc"
        if pay_with == "credits" and credits < price:
            raise ApiError(
                "INSUFFICIENT_CREDITS",
                detail=f"the account's credits ({usdc(credits)} USDC) do not cover the price ({usdc(price)} "
                "USDC); top up, or pay with USDC",
                details={"creditsMicroUsdc": credits, "priceMicroUsdc": price},
                headers=await self._purchase_challenge(request.payer, request.tierId, request.months, price),
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

    async def x402_amount(self, price: int) -> int:
        """What an x402 purchase attaches: the whole price, at least the deposit minimum."""
        return max(price, int((await self.config()).deposit_min_micro), 1)

    async def _purchase_challenge(self, payer: str, tier_id: int, months: int, price: int) -> dict[str, str]:
        """The `PAYMENT-REQUIRED` header of the same plan bought over x402 (POST /v1/x402/purchase)."""
        if self.challenges is None:
            return {}
        amount = await self.x402_amount(price)
        header = self.challenges.purchase_header(
            payer, tier_id, months, price, amount, error="INSUFFICIENT_CREDITS"
        )
        return {"PAYMENT-REQUIRED": header}

    # Flags ------------------------------------------------------------------------------------------------
    async def require_account(self, address: str) -> Any:
        """The address's own account view; 402 NO_ENTITLEMENT (NO_ACCOUNT) with a top-up challenge when none."""
        account = await self.account_view(address)
        if account is not None:
            return account
        headers: dict[str, str] = {}
        if self.challenges is not None:
            minimum = max(int((await self.config()).deposit_min_micro), 1)
            headers["PAYMENT-REQUIRED"] = self.challenges.topup_header(
                address, minimum, error="NO_ENTITLEMENT"
            )
        raise ApiError(
            "NO_ENTITLEMENT",
            detail=f"{address} has no account in the contract: deposit or buy a plan first",
            details={"reason": "NO_ACCOUNT"},
            headers=headers,
        )

    def renew_outcome(self, account: Any | None, tiers: dict[int, Any]) -> str | None:
        """What `renew` would do now, as the contract decides it: None when it renews, else why not."""
        if account is None:
            return "no_account"
        running = account.running
        now = self.now_ms()
        if running is None or int(running.end_ms) == 0:
            return "no_running_plan"
        if account.queued is not None:
            return "queued_block_exists"
        if not bool(account.auto_renew):
            return "auto_renew_off"
        if int(running.end_ms) - now > RENEW_WINDOW_MS:
            return "not_due"  # more than a day of the running block left
        tier = tiers.get(int(running.tier_id))
        price = int(tier.price_micro) * int(running.months) if tier is not None else 0
        if bool(account.suspended):
            return "skipped_account_suspended"
        if tier is None or not bool(tier.purchasable) or int(tier.period_ms) == 0:
            return "skipped_tier_unavailable"
        if int(account.credits_micro) < price:
            return "skipped_insufficient_credits"
        return None

    async def prepare_flags(self, request: PrepareFlagsRequest) -> PreparedTransactions:
        """One transaction per change: setAutoRenew, setPayg, releaseEscrow, renew (in that order)."""
        address = request.address
        calls: list[Call] = []
        if request.autoRenew is not None:
            calls.append(Call("setAutoRenew", [request.autoRenew], [request.autoRenew]))
        if request.payg is not None:
            payg = request.payg
            calls.append(
                Call(
                    "setPayg",
                    [payg.enabled, payg.budgetMicroUsdc, payg.autoTopup, payg.maxPaygPriceMicroUsdc],
                    [
                        payg.enabled,
                        str(payg.budgetMicroUsdc),
                        payg.autoTopup,
                        str(payg.maxPaygPriceMicroUsdc),
                    ],
                )
            )
        if request.releaseEscrow:
            calls.append(Call("releaseEscrow", [], []))
        target = request.renewFor or address
        if request.renew or request.renewFor is not None:
            calls.append(Call("renew", [Address.new_from_bech32(target)], [target]))
        if not calls:
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="name at least one change: autoRenew, payg, releaseEscrow or renew",
                details={"field": "body"},
            )
        await self.require_open(deposit=False)
        account = await self.require_account(address)
        if any(call.function == "renew" for call in calls):
            renewed = account if target == address else await self.account_view(target)
            outcome = self.renew_outcome(renewed, await self.tiers())
            if outcome is not None:
                raise ApiError(
                    "RENEW_NOT_APPLICABLE",
                    detail=f"renewing {target} now would do nothing ({outcome.replace('_', ' ')})",
                    details={"predictedOutcome": outcome, "account": target},
                )
        config = await self.config()
        free_ops = self.free_operations(config)
        now = self.now_ms()
        day, month, free_again = (
            await self.flag_calls(address) if self.flag_calls is not None else (0, 0, now)
        )
        per_day, per_month = self.flag_limits
        kinds: list[tuple[bool, int | None]] = []
        past_allowance = False
        for call in calls:
            own = call.function != "renew" or target == address
            within = day < per_day and month < per_month
            free = call.function in free_ops and own and within
            if free and call.function in FLAG_FUNCTIONS:
                day, month = day + 1, month + 1
            past_allowance = past_allowance or (call.function in FLAG_FUNCTIONS and own and not within)
            kinds.append((free, None))
        prepared, assignment = await self.builder.build(address, calls, kinds=kinds)
        if past_allowance and self.billable is not None:
            # Purchase builders, flags rule: past the free flag calls an address that cannot be billed is
            # refused as a rate limit of the free flow, for as long as its oldest free call still counts.
            first = next(p for p in prepared if not p.free)
            probe = tx_from_wire({**first.transaction.model_dump(), "signature": "00" * 64})
            if not await self.billable(probe, address):
                retry_ms = max(1, free_again - now)
                raise ApiError(
                    "RATE_LIMITED",
                    detail=f"{address} used its free flag calls ({per_day} per 24 h, {per_month} per 30 "
                    "days) and has no plan or pay-as-you-go to bill this one: wait until the oldest one "
                    "leaves its window, or buy a plan",
                    details={"scope": "free_flow", "retryAfterMs": retry_ms, "account": address},
                    headers={"Retry-After": str(-(-retry_ms // 1000))},
                )
        return PreparedTransactions(
            transactions=[self._priced(one) for one in prepared], assignment=assignment
        )

    # Senders ----------------------------------------------------------------------------------------------
    async def prepare_senders(self, request: PrepareSendersRequest) -> PreparedTransaction:
        """addSenders(max_fee, senders...) with the quoted fee as the ceiling (billed), or removeSenders."""
        if bool(request.add) == bool(request.remove):
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="one transaction per request: name senders to `add` or to `remove`, not both",
                details={"field": "add" if not request.add else "remove"},
            )
        await self.require_open(deposit=False)
        account = await self.require_account(request.account)
        config = await self.config()
        if request.remove:
            current = set(await self.mirror.senders(request.account))
            strangers = [s for s in request.remove if s not in current]
            if strangers:
                raise ApiError(
                    "MALFORMED_REQUEST",
                    detail=f"{strangers[0]} is not an authorised sender of {request.account}",
                    details={"field": "remove"},
                )
            senders = list(dict.fromkeys(request.remove))
            call = Call("removeSenders", [[Address.new_from_bech32(s) for s in senders]], senders)
            free = call.function in self.free_operations(config)
            prepared, _ = await self.builder.build(request.account, [call], kinds=[(free, None)])
            return self._priced(prepared[0])
        current = set(await self.mirror.senders(request.account))
        new = [s for s in dict.fromkeys(request.add) if s not in current and s != request.account]
        fee = int(config.sender_fee_ru) * int(config.ru_price_micro) * len(new)
        credits = int(account.credits_micro)
        if credits < fee:
            raise ApiError(
                "INSUFFICIENT_CREDITS",
                detail=f"adding {len(new)} sender(s) costs {usdc(fee)} USDC of credits; the account holds "
                f"{usdc(credits)} USDC: top up first",
                details={"creditsMicroUsdc": credits, "priceMicroUsdc": fee},
                headers=(
                    {
                        "PAYMENT-REQUIRED": self.challenges.topup_header(
                            request.account, fee - credits, error="INSUFFICIENT_CREDITS"
                        )
                    }
                    if self.challenges is not None
                    else {}
                ),
            )
        senders = list(dict.fromkeys(request.add))
        call = Call(
            "addSenders",
            [fee, [Address.new_from_bech32(s) for s in senders]],
            [str(fee), *senders],
        )
        # Never free: billed as a normal relay, and the contract charges the fee (at most max_fee).
        prepared, _ = await self.builder.build(request.account, [call], kinds=[(False, None)], fees=[fee])
        return self._priced(prepared[0])

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
