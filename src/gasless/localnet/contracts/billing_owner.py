"""Owner-only endpoints of the billing contract model (they work while the contract is paused)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from gasless.chain.abi import enum_name
from gasless.localnet.contracts.abi_contract import to_bytes32
from gasless.localnet.contracts.billing_base import (
    ERR_BAD_DEPOSIT_BOUNDS,
    ERR_BAD_RATE_CLASS,
    ERR_BAD_SWAP_SHARE,
    ERR_BATCH_EXISTS,
    ERR_RELAYER_RETIRED,
    ERR_UNKNOWN_ACCOUNT,
    ERR_UNKNOWN_ENDPOINT,
    ERR_UNKNOWN_RATE_CLASS,
    BillingBase,
)
from gasless.localnet.contracts.billing_state import (
    BPS,
    SENDER_FEE_NOTICE_MS,
    ZERO_REF,
    AccountState,
    PauseState,
    PendingFee,
    RateClass,
    RelayerInfo,
    Settlement,
    Tier,
    rate_class_changes,
    settle_pending_fee,
    tier_changes,
    valid_rate_class,
)
from gasless.localnet.vm import CallContext, ContractError


class OwnerEndpoints(BillingBase):
    """Configuration, grants, usage settlement, pauses, relayer states, suspensions."""

    def _ep_grant(self, ctx: CallContext, address: bytes, tier_id: int, months: int) -> None:
        """A plan block without payment, placed as a purchase would be (any tier, purchasable or not)."""
        now = ctx.block_timestamp_ms
        tier = self._tier(tier_id)
        self._check_months(months)
        account = self._account(address, now) or AccountState(created_ms=now)
        account, block, kind, dropped = self._place_block(account, tier, months, 0, ZERO_REF, now)
        account = self._credit_dropped(ctx, address, account, dropped)
        self._put(address, account)
        self.emit(
            ctx,
            "granted",
            account=address,
            tier_id=tier_id,
            months=months,
            start_ms=block.start_ms,
            end_ms=block.end_ms,
            queued=kind == "Queue",
        )

    def _ep_settle_usage(
        self,
        ctx: CallContext,
        batch_id: int,
        usage_root: list[int],
        row_count: int,
        total_ru: int,
        charges: list[SimpleNamespace],
    ) -> None:
        """Record the batch root; debit each PAYG charge from escrow, capped by max price and escrow.

        With auto top-up, credits refill the escrow first, up to what the charge needs.
        """
        now = ctx.block_timestamp_ms
        if batch_id in self.state.settlements:
            raise ContractError(ERR_BATCH_EXISTS)
        root = to_bytes32(usage_root, "usage_root")
        for charge in charges:
            address: bytes = charge.account
            account = self._account(address, now)
            if account is None:
                raise ContractError(ERR_UNKNOWN_ACCOUNT)
            cap = charge.payg_micro
            if account.payg.max_payg_price_micro:
                cap = min(cap, charge.ru * account.payg.max_payg_price_micro)
            if account.payg.auto_topup and account.escrow_micro < cap:
                topup = min(cap - account.escrow_micro, account.credits_micro)
                if topup:
                    account = replace(
                        account,
                        credits_micro=account.credits_micro - topup,
                        escrow_micro=account.escrow_micro + topup,
                    )
                    self.emit(
                        ctx,
                        "escrowMoved",
                        account=address,
                        direction="ToEscrow",
                        amount=topup,
                        credits_after=account.credits_micro,
                        escrow_after=account.escrow_micro,
                    )
            amount = min(cap, account.escrow_micro)
            account = replace(account, escrow_micro=account.escrow_micro - amount)
            self._put(address, account)
            self.emit(
                ctx,
                "paygSettled",
                account=address,
                batch_id=batch_id,
                ru=charge.ru,
                amount=amount,
                requested=charge.payg_micro,
                escrow_after=account.escrow_micro,
            )
        self.state.settlements[batch_id] = Settlement(batch_id, root, row_count, total_ru, now)
        self.emit(
            ctx, "usageSettled", batch_id=batch_id, usage_root=root, row_count=row_count, total_ru=total_ru
        )

    # Pauses -----------------------------------------------------------------------------------------
    def _ep_set_paused(self, ctx: CallContext, paused: bool) -> None:
        self._set_pause(ctx, replace(self.state.pause, paused=paused))

    def _ep_set_deposits_paused(self, ctx: CallContext, paused: bool) -> None:
        self._set_pause(ctx, replace(self.state.pause, deposits_paused=paused))

    def _set_pause(self, ctx: CallContext, pause: PauseState) -> None:
        self.state.pause = pause
        self.emit(ctx, "pauseChanged", paused=pause.paused, deposits_paused=pause.deposits_paused)

    # Catalogue and tariffs --------------------------------------------------------------------------
    def _ep_set_tier(
        self,
        ctx: CallContext,
        tier_id: int,
        name: bytes,
        audience: SimpleNamespace,
        rate_class: int,
        price_micro: int,
        included_ru: int,
        period_ms: int,
        purchasable: bool,
        payg: bool,
    ) -> None:
        if rate_class not in self.state.rate_classes:
            raise ContractError(ERR_UNKNOWN_RATE_CLASS)
        tier = Tier(
            tier_id,
            name,
            enum_name(audience),
            rate_class,
            price_micro,
            included_ru,
            period_ms,
            purchasable,
            payg,
        )
        old = self.state.tiers.get(tier_id)
        self.state.tiers[tier_id] = tier
        self._tariff(ctx, tier_changes(old, tier, ctx.block_timestamp_ms))

    def _ep_set_rate_class(
        self,
        ctx: CallContext,
        class_id: int,
        ru_per_sec: int,
        ru_burst: int,
        gas_per_sec_per_shard: int,
        gas_burst_per_shard: int,
        max_gas_limit: int,
        ru_per_hour: int,
    ) -> None:
        rc = RateClass(
            class_id,
            ru_per_sec,
            ru_burst,
            gas_per_sec_per_shard,
            gas_burst_per_shard,
            max_gas_limit,
            ru_per_hour,
        )
        if not valid_rate_class(rc):
            raise ContractError(ERR_BAD_RATE_CLASS)
        old = self.state.rate_classes.get(class_id)
        self.state.rate_classes[class_id] = rc
        self._tariff(ctx, rate_class_changes(old, rc, ctx.block_timestamp_ms))

    def _ep_set_deposit_bounds(self, ctx: CallContext, min_micro: int, max_micro: int) -> None:
        if max_micro and min_micro > max_micro:
            raise ContractError(ERR_BAD_DEPOSIT_BOUNDS)
        config = self.state.config
        now = ctx.block_timestamp_ms
        changes = []
        if min_micro != config.deposit_min_micro:
            changes.append(("DepositMin", 0, min_micro, now))
        if max_micro != config.deposit_max_micro:
            changes.append(("DepositMax", 0, max_micro, now))
        self.state.config = replace(config, deposit_min_micro=min_micro, deposit_max_micro=max_micro)
        self._tariff(ctx, changes)

    def _ep_set_sender_fee_ru(self, ctx: CallContext, fee_ru: int) -> None:
        """An increase waits SENDER_FEE_NOTICE_MS (replacing any pending one); a decrease applies at once."""
        now = ctx.block_timestamp_ms
        config = settle_pending_fee(self.state.config, now)
        if fee_ru > config.sender_fee_ru:
            effective = now + SENDER_FEE_NOTICE_MS
            config = replace(config, pending_sender_fee=PendingFee(fee_ru, effective))
        elif fee_ru < config.sender_fee_ru or config.pending_sender_fee is not None:
            effective = now
            config = replace(config, sender_fee_ru=fee_ru, pending_sender_fee=None)
        else:
            return
        self.state.config = config
        self._tariff(ctx, [("SenderFeeRu", 0, fee_ru, effective)])

    def _ep_set_ru_price(self, ctx: CallContext, price_micro: int) -> None:
        if price_micro == self.state.config.ru_price_micro:
            return
        self.state.config = replace(self.state.config, ru_price_micro=price_micro)
        self._tariff(ctx, [("RuPrice", 0, price_micro, ctx.block_timestamp_ms)])

    def _ep_set_free_operations(self, ctx: CallContext, names: list[bytes]) -> None:
        operations: list[str] = []
        for raw in names:
            name = raw.decode("utf-8", errors="replace")
            if name not in self._endpoints:
                raise ContractError(ERR_UNKNOWN_ENDPOINT)
            if name not in operations:
                operations.append(name)
        if tuple(operations) == self.state.config.free_operations:
            return
        self.state.config = replace(self.state.config, free_operations=tuple(operations))
        self._tariff(ctx, [("FreeOperations", 0, len(operations), ctx.block_timestamp_ms)])

    def _ep_set_swap_config(self, ctx: CallContext, share_bps: int, budget_micro: int) -> None:
        if share_bps > BPS:
            raise ContractError(ERR_BAD_SWAP_SHARE)
        self.state.config = replace(
            self.state.config, swap_share_bps=share_bps, swap_budget_micro=budget_micro
        )
        self.emit(ctx, "swapConfigChanged", share_bps=share_bps, budget_micro=budget_micro)

    # Relayers and accounts --------------------------------------------------------------------------
    def _ep_set_relayer_state(self, ctx: CallContext, relayer: bytes, state: SimpleNamespace) -> None:
        """Retired is final."""
        name = enum_name(state)
        old = self.state.relayers.get(relayer)
        if old is not None and old.state == name:
            return
        if old is not None and old.state == "Retired":
            raise ContractError(ERR_RELAYER_RETIRED)
        self.state.relayers[relayer] = RelayerInfo(relayer, name, ctx.block_timestamp_ms)
        self.emit(ctx, "relayerStateChanged", relayer=relayer, state=name, since_ms=ctx.block_timestamp_ms)

    def _ep_set_account_suspended(self, ctx: CallContext, address: bytes, suspended: bool) -> None:
        account = self._require_account(address, ctx.block_timestamp_ms)
        self._put(address, replace(account, suspended=suspended))
        self.emit(ctx, "accountSuspended", account=address, suspended=suspended)
