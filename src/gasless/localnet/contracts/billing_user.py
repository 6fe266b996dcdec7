"""Account-holder endpoints of the billing contract model: deposits, plans, flags, renewals, senders."""

from __future__ import annotations

from dataclasses import replace

from gasless.localnet.contracts.abi_contract import to_bytes32
from gasless.localnet.contracts.billing_base import (
    ERR_ACCOUNT_SUSPENDED,
    ERR_INSUFFICIENT_CREDITS,
    ERR_NO_SENDERS,
    ERR_NOT_A_SENDER,
    ERR_PRICE_ABOVE_MAX,
    ERR_RENEW_NOT_APPLICABLE,
    ERR_SENDER_TAKEN,
    BillingBase,
)
from gasless.localnet.contracts.billing_state import (
    RENEW_WINDOW_MS,
    ZERO_REF,
    AccountState,
    PaygSettings,
    PlanBlock,
    effective_sender_fee_ru,
)
from gasless.localnet.vm import CallContext, ContractError


class UserEndpoints(BillingBase):
    """Endpoints any account holder calls (all refused with ERR_PAUSED while the contract is paused)."""

    def _ep_deposit(self, ctx: CallContext) -> None:
        self._deposit(ctx, ctx.caller)

    def _ep_deposit_for(self, ctx: CallContext, beneficiary: bytes) -> None:
        self._deposit(ctx, beneficiary)

    def _ep_subscribe(
        self, ctx: CallContext, tier_id: int, months: int, max_price: int, ref: list[int]
    ) -> None:
        self._subscribe(ctx, ctx.caller, tier_id, months, max_price, to_bytes32(ref, "ref"))

    def _ep_deposit_and_subscribe(
        self, ctx: CallContext, tier_id: int, months: int, max_price: int, ref: list[int]
    ) -> None:
        ref_bytes = to_bytes32(ref, "ref")
        self._deposit(ctx, ctx.caller)
        self._subscribe(ctx, ctx.caller, tier_id, months, max_price, ref_bytes)

    # Flags ------------------------------------------------------------------------------------------
    def _ep_set_auto_renew(self, ctx: CallContext, enabled: bool) -> None:
        self._require_not_paused()
        account = self._require_account(ctx.caller, ctx.block_timestamp_ms)
        self._put(ctx.caller, replace(account, auto_renew=enabled))
        self.emit(ctx, "autoRenewChanged", account=ctx.caller, enabled=enabled)

    def _ep_set_payg(
        self, ctx: CallContext, enabled: bool, budget: int, auto_topup: bool, max_payg_price: int
    ) -> None:
        """Each call with `enabled` moves `budget` from credits to escrow (a top-up)."""
        self._require_not_paused()
        account = self._require_account(ctx.caller, ctx.block_timestamp_ms)
        if enabled and account.suspended:
            raise ContractError(ERR_ACCOUNT_SUSPENDED)
        moved = budget if enabled else 0
        if account.credits_micro < moved:
            raise ContractError(ERR_INSUFFICIENT_CREDITS)
        account = replace(
            account,
            credits_micro=account.credits_micro - moved,
            escrow_micro=account.escrow_micro + moved,
            payg=PaygSettings(enabled, budget, auto_topup, max_payg_price),
        )
        self._put(ctx.caller, account)
        self.emit(
            ctx,
            "paygChanged",
            account=ctx.caller,
            enabled=enabled,
            budget_micro=budget,
            auto_topup=auto_topup,
            max_payg_price_micro=max_payg_price,
        )
        if moved:
            self._emit_escrow(ctx, ctx.caller, account, "ToEscrow", moved)

    def _ep_release_escrow(self, ctx: CallContext) -> None:
        self._require_not_paused()
        account = self._require_account(ctx.caller, ctx.block_timestamp_ms)
        amount = account.escrow_micro
        if amount:
            account = replace(account, credits_micro=account.credits_micro + amount, escrow_micro=0)
            self._put(ctx.caller, account)
            self._emit_escrow(ctx, ctx.caller, account, "ToCredits", amount)

    def _emit_escrow(
        self, ctx: CallContext, address: bytes, account: AccountState, direction: str, amount: int
    ) -> None:
        self.emit(
            ctx,
            "escrowMoved",
            account=address,
            direction=direction,
            amount=amount,
            credits_after=account.credits_micro,
            escrow_after=account.escrow_micro,
        )

    # Renewal ----------------------------------------------------------------------------------------
    def _ep_renew(self, ctx: CallContext, address: bytes) -> None:
        """Renew for the same months at the tier's current price, starting when the running block ends."""
        now = ctx.block_timestamp_ms
        self._require_not_paused()
        account = self._account(address, now)
        running = account.running if account is not None else None
        if (
            account is None
            or running is None
            or not running.has_period
            or not account.auto_renew
            or account.queued is not None
            or running.end_ms - now > RENEW_WINDOW_MS
        ):
            raise ContractError(ERR_RENEW_NOT_APPLICABLE)
        tier = self.state.tiers.get(running.tier_id)
        price = tier.price_micro * running.months if tier is not None else 0
        reason = None
        if account.suspended:
            reason = "AccountSuspended"
        elif tier is None or not tier.purchasable or tier.period_ms == 0:
            reason = "TierUnavailable"
        elif account.credits_micro < price:
            reason = "InsufficientCredits"
        if reason is not None or tier is None:
            self.emit(
                ctx,
                "renewalSkipped",
                account=address,
                tier_id=running.tier_id,
                reason=reason,
                price=price,
                credits=account.credits_micro,
            )
            return
        start = max(running.end_ms, now)
        block = PlanBlock(
            tier.id,
            start,
            start + running.months * tier.period_ms,
            tier.included_ru,
            running.months,
            price,
            ZERO_REF,
        )
        account = replace(account, credits_micro=account.credits_micro - price)
        account = replace(account, running=block) if start <= now else replace(account, queued=block)
        self._put(address, account)
        self.emit(
            ctx,
            "renewed",
            account=address,
            tier_id=tier.id,
            months=block.months,
            price=price,
            start_ms=block.start_ms,
            end_ms=block.end_ms,
            credits_after=account.credits_micro,
        )

    # Authorised senders -----------------------------------------------------------------------------
    def _ep_add_senders(self, ctx: CallContext, max_fee: int, senders: list[bytes]) -> None:
        """Senders already in this account are skipped and not charged; the fee uses the fee in force now."""
        now = ctx.block_timestamp_ms
        self._require_not_paused()
        account = self._require_account(ctx.caller, now)
        if account.suspended:
            raise ContractError(ERR_ACCOUNT_SUSPENDED)
        if not senders:
            raise ContractError(ERR_NO_SENDERS)
        current = self.state.senders.get(ctx.caller, ())
        new: list[bytes] = []
        for sender in senders:
            holder = self.state.sender_account.get(sender)
            if holder is not None and holder != ctx.caller:
                raise ContractError(ERR_SENDER_TAKEN)
            if holder is None and sender not in new:
                new.append(sender)
        if not new:
            return
        fee_ru = effective_sender_fee_ru(self.state.config, now)
        fee = fee_ru * self.state.config.ru_price_micro * len(new)
        if fee > max_fee:
            raise ContractError(ERR_PRICE_ABOVE_MAX)
        if account.credits_micro < fee:
            raise ContractError(ERR_INSUFFICIENT_CREDITS)
        account = replace(account, credits_micro=account.credits_micro - fee)
        self._put(ctx.caller, account)
        self.state.senders[ctx.caller] = current + tuple(new)
        for sender in new:
            self.state.sender_account[sender] = ctx.caller
            self.emit(ctx, "senderAdded", account=ctx.caller, sender=sender)
        self.emit(
            ctx,
            "senderFee",
            account=ctx.caller,
            amount=fee,
            sender_count=len(new),
            fee_ru=fee_ru,
            credits_after=account.credits_micro,
        )

    def _ep_remove_senders(self, ctx: CallContext, senders: list[bytes]) -> None:
        self._require_not_paused()
        if not senders:
            raise ContractError(ERR_NO_SENDERS)
        removed: list[bytes] = []
        for sender in senders:
            if self.state.sender_account.get(sender) != ctx.caller:
                raise ContractError(ERR_NOT_A_SENDER)
            if sender not in removed:
                removed.append(sender)
        gone = set(removed)
        self.state.senders[ctx.caller] = tuple(
            s for s in self.state.senders.get(ctx.caller, ()) if s not in gone
        )
        if not self.state.senders[ctx.caller]:
            del self.state.senders[ctx.caller]
        for sender in removed:
            del self.state.sender_account[sender]
            self.emit(ctx, "senderRemoved", account=ctx.caller, sender=sender)
