"""Shared parts of the billing contract model: error strings, account access, plan placement, deposits."""

from __future__ import annotations

from dataclasses import replace

from gasless.chain.abi import decode_outputs, encode_args, load_pair_abi
from gasless.localnet.contracts.abi_contract import AbiContract
from gasless.localnet.contracts.billing_state import (
    BPS,
    MAX_MONTHS,
    AccountState,
    BillingState,
    PlanBlock,
    TariffEntry,
    Tier,
    append_tariff,
    swap_window,
)
from gasless.localnet.vm import EGLD, CallContext, ContractError, Payment

ERR_PAUSED = "ERR_PAUSED"
ERR_DEPOSITS_PAUSED = "ERR_DEPOSITS_PAUSED"
ERR_BAD_PAYMENT_TOKEN = "ERR_BAD_PAYMENT_TOKEN"
ERR_DEPOSIT_BELOW_MIN = "ERR_DEPOSIT_BELOW_MIN"
ERR_DEPOSIT_ABOVE_MAX = "ERR_DEPOSIT_ABOVE_MAX"
ERR_SWAP_BUDGET_EXHAUSTED = "ERR_SWAP_BUDGET_EXHAUSTED"
ERR_SWAP_UNEXPECTED_TOKEN = "ERR_SWAP_UNEXPECTED_TOKEN"
ERR_UNKNOWN_TIER = "ERR_UNKNOWN_TIER"
ERR_TIER_NOT_PURCHASABLE = "ERR_TIER_NOT_PURCHASABLE"
ERR_BAD_MONTHS = "ERR_BAD_MONTHS"
ERR_PRICE_ABOVE_MAX = "ERR_PRICE_ABOVE_MAX"
ERR_INSUFFICIENT_CREDITS = "ERR_INSUFFICIENT_CREDITS"
ERR_ACCOUNT_SUSPENDED = "ERR_ACCOUNT_SUSPENDED"
ERR_DOWNGRADE_NOT_IMMEDIATE = "ERR_DOWNGRADE_NOT_IMMEDIATE"
ERR_QUEUED_BLOCK_EXISTS = "ERR_QUEUED_BLOCK_EXISTS"
ERR_RENEW_NOT_APPLICABLE = "ERR_RENEW_NOT_APPLICABLE"
ERR_UNKNOWN_ACCOUNT = "ERR_UNKNOWN_ACCOUNT"
ERR_NO_SENDERS = "ERR_NO_SENDERS"
ERR_SENDER_TAKEN = "ERR_SENDER_TAKEN"
ERR_NOT_A_SENDER = "ERR_NOT_A_SENDER"
ERR_BATCH_EXISTS = "ERR_BATCH_EXISTS"
ERR_UNKNOWN_RATE_CLASS = "ERR_UNKNOWN_RATE_CLASS"
ERR_BAD_RATE_CLASS = "ERR_BAD_RATE_CLASS"
ERR_BAD_DEPOSIT_BOUNDS = "ERR_BAD_DEPOSIT_BOUNDS"
ERR_BAD_SWAP_SHARE = "ERR_BAD_SWAP_SHARE"
ERR_UNKNOWN_ENDPOINT = "ERR_UNKNOWN_ENDPOINT"
ERR_RELAYER_RETIRED = "ERR_RELAYER_RETIRED"


class BillingBase(AbiContract):
    """Storage access and the rules shared by several endpoints."""

    name = "gasless-billing"
    state: BillingState

    @property
    def owner(self) -> bytes:
        return self.state.config.owner

    # Guards and storage -----------------------------------------------------------------------------
    def _require_not_paused(self) -> None:
        if self.state.pause.paused:
            raise ContractError(ERR_PAUSED)

    def _account(self, address: bytes, now_ms: int) -> AccountState | None:
        account = self.state.accounts.get(address)
        return account.rolled(now_ms) if account is not None else None

    def _require_account(self, address: bytes, now_ms: int) -> AccountState:
        account = self._account(address, now_ms)
        if account is None:
            raise ContractError(ERR_UNKNOWN_ACCOUNT)
        return account

    def _put(self, address: bytes, account: AccountState) -> None:
        self.state.accounts[address] = account

    def _tier(self, tier_id: int) -> Tier:
        tier = self.state.tiers.get(tier_id)
        if tier is None:
            raise ContractError(ERR_UNKNOWN_TIER)
        return tier

    def _tariff(self, ctx: CallContext, changes: list[tuple[str, int, int, int]]) -> None:
        for entry in append_tariff(self.state, ctx.block_timestamp_ms, changes):
            self._emit_tariff(ctx, entry)

    def _emit_tariff(self, ctx: CallContext, entry: TariffEntry) -> None:
        self.emit(
            ctx,
            "tariffChanged",
            seq=entry.seq,
            kind=entry.kind,
            subject_id=entry.subject_id,
            value=entry.value,
            effective_ms=entry.effective_ms,
            policy_version=entry.policy_version,
        )

    # Plans ------------------------------------------------------------------------------------------
    @staticmethod
    def _check_months(months: int) -> None:
        if not 1 <= months <= MAX_MONTHS:
            raise ContractError(ERR_BAD_MONTHS)

    def _place_block(
        self, account: AccountState, tier: Tier, months: int, price: int, ref: bytes, now_ms: int
    ) -> tuple[AccountState, PlanBlock, str, PlanBlock | None]:
        """Where a new block of `tier` goes: (account, block, kind Start|Queue|Upgrade, dropped queued block).

        No period plan running: the block starts now (replacing an ended or period-less block). A period
        plan running: a period-less tier is refused; a strictly more expensive tier per month replaces the
        running block now (its remaining time is forfeited) and drops the queued block, whose price the
        caller credits back; otherwise the block queues behind the running one, if nothing is queued yet.
        """
        running = account.running

        def block(start_ms: int) -> PlanBlock:
            end_ms = start_ms + months * tier.period_ms if tier.period_ms else 0
            return PlanBlock(tier.id, start_ms, end_ms, tier.included_ru, months, price, ref)

        if running is None or not running.has_period or running.ended(now_ms):
            new = block(now_ms)
            return replace(account, running=new, queued=None), new, "Start", None
        if tier.period_ms == 0:
            raise ContractError(ERR_DOWNGRADE_NOT_IMMEDIATE)
        running_tier = self.state.tiers.get(running.tier_id)
        if tier.price_micro > (running_tier.price_micro if running_tier else 0):
            new = block(now_ms)
            return replace(account, running=new, queued=None), new, "Upgrade", account.queued
        if account.queued is not None:
            raise ContractError(ERR_QUEUED_BLOCK_EXISTS)
        new = block(running.end_ms)
        return replace(account, queued=new), new, "Queue", None

    def _credit_dropped(
        self, ctx: CallContext, address: bytes, account: AccountState, dropped: PlanBlock | None
    ) -> AccountState:
        """Credit back the price of a queued block an upgrade dropped."""
        if dropped is None:
            return account
        account = replace(account, credits_micro=account.credits_micro + dropped.price_paid_micro)
        self.emit(
            ctx,
            "queuedBlockCredited",
            account=address,
            tier_id=dropped.tier_id,
            amount=dropped.price_paid_micro,
            credits_after=account.credits_micro,
        )
        return account

    def _subscribe(
        self, ctx: CallContext, address: bytes, tier_id: int, months: int, max_price: int, ref: bytes
    ) -> None:
        now = ctx.block_timestamp_ms
        self._require_not_paused()
        tier = self._tier(tier_id)
        if not tier.purchasable:
            raise ContractError(ERR_TIER_NOT_PURCHASABLE)
        self._check_months(months)
        price = tier.price_micro * months
        if price > max_price:
            raise ContractError(ERR_PRICE_ABOVE_MAX)
        account = self._account(address, now) or AccountState(created_ms=now)
        if account.suspended:
            raise ContractError(ERR_ACCOUNT_SUSPENDED)
        account, block, kind, dropped = self._place_block(account, tier, months, price, ref, now)
        account = self._credit_dropped(ctx, address, account, dropped)
        if account.credits_micro < price:
            raise ContractError(ERR_INSUFFICIENT_CREDITS)
        account = replace(account, credits_micro=account.credits_micro - price)
        self._put(address, account)
        self.emit(
            ctx,
            "subscribed",
            account=address,
            tier_id=tier_id,
            months=months,
            price=price,
            start_ms=block.start_ms,
            end_ms=block.end_ms,
            ref=block.ref,
            queued=kind == "Queue",
            kind=kind,
        )

    # Deposits ---------------------------------------------------------------------------------------
    def _deposit(self, ctx: CallContext, beneficiary: bytes) -> None:
        """Checks, the gas-funding swap, then credits; all of it reverts if any part fails."""
        now = ctx.block_timestamp_ms
        self._require_not_paused()
        if self.state.pause.deposits_paused:
            raise ContractError(ERR_DEPOSITS_PAUSED)
        config = self.state.config
        amount = ctx.single_esdt(config.payment_token)
        if amount <= 0 or amount < config.deposit_min_micro:
            raise ContractError(ERR_DEPOSIT_BELOW_MIN)
        if config.deposit_max_micro and amount > config.deposit_max_micro:
            raise ContractError(ERR_DEPOSIT_ABOVE_MAX)
        share = amount * config.swap_share_bps // BPS
        if share:
            start, spent = swap_window(config, now)
            if config.swap_budget_micro and spent + share > config.swap_budget_micro:
                raise ContractError(ERR_SWAP_BUDGET_EXHAUSTED)
            self.state.config = replace(
                config, swap_window_start_ms=start, swap_window_spent_micro=spent + share
            )
            self._fund_gas(ctx, share)
        account = self._account(beneficiary, now) or AccountState(created_ms=now)
        account = replace(account, credits_micro=account.credits_micro + amount)
        self._put(beneficiary, account)
        self.emit(
            ctx,
            "deposit",
            account=beneficiary,
            payer=ctx.caller,
            amount=amount,
            credits_after=account.credits_micro,
        )

    def _fund_gas(self, ctx: CallContext, usdc: int) -> None:
        """Swap `usdc` to WEGLD on the pair, unwrap it, and send the EGLD to the gas tank."""
        config = self.state.config
        pair_abi = load_pair_abi()
        returned = ctx.call(
            config.pair,
            "swapTokensFixedInput",
            encode_args(pair_abi, "swapTokensFixedInput", [config.wegld_token, 1]),
            [Payment(config.payment_token, usdc)],
        )
        (received,) = decode_outputs(pair_abi, "swapTokensFixedInput", returned)
        if received.token_identifier != config.wegld_token:
            raise ContractError(ERR_SWAP_UNEXPECTED_TOKEN)
        egld = received.amount
        ctx.call(config.wrapper, "unwrapEgld", [], [Payment(config.wegld_token, egld)])
        ctx.transfer(config.gas_tank, EGLD, egld)
        self.emit(ctx, "gasFunded", gas_tank=config.gas_tank, usdc_swapped=usdc, egld_out=egld)
