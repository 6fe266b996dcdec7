"""The exchange venue of localnet: an xExchange-like USDC/WEGLD pair and the EGLD wrapper.

Token identifiers are constructor arguments. On localnet: WEGLD `WEGLD-c0ffee` (`LOCALNET_WEGLD_TOKEN`)
and USDC `USDC-c0ffee` (the localnet payment token). Like xExchange's WEGLD/USDC pair, the first token is
WEGLD and the second USDC. Whoever deploys these models must also give their accounts the balances they
stand for: the pair holds its reserves, the wrapper holds the locked EGLD and a WEGLD float (it stands in
for the real wrapper's mint and burn rights: WEGLD it receives stays in its account, out of circulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gasless.chain.abi import PAIR_ABI_PATH, WRAPPER_ABI_PATH
from gasless.chain.addresses import address_of
from gasless.localnet.contracts.abi_contract import AbiContract
from gasless.localnet.vm import EGLD, CallContext, ContractError

LOCALNET_WEGLD_TOKEN = "WEGLD-c0ffee"

ERR_SWAP_VENUE_PAUSED = "ERR_SWAP_VENUE_PAUSED"
ERR_BAD_PAYMENT_TOKEN = "ERR_BAD_PAYMENT_TOKEN"
ERR_UNKNOWN_TOKEN = "ERR_UNKNOWN_TOKEN"
ERR_ZERO_AMOUNT = "ERR_ZERO_AMOUNT"
ERR_ZERO_OUTPUT = "ERR_ZERO_OUTPUT"
ERR_SLIPPAGE_EXCEEDED = "ERR_SLIPPAGE_EXCEEDED"
ERR_INSUFFICIENT_LIQUIDITY = "ERR_INSUFFICIENT_LIQUIDITY"

FEE_DENOMINATOR = 100_000
TOTAL_FEE = 300  # 0.3 %, xExchange's total fee percent out of 100 000

# Processing gas per endpoint, modelling typical costs of the real contracts; a function of the name only.
PAIR_GAS: dict[str, int] = {"swapTokensFixedInput": 4_000_000, "pause": 2_000_000, "resume": 2_000_000}
WRAPPER_GAS: dict[str, int] = {"wrapEgld": 1_500_000, "unwrapEgld": 1_500_000}
VIEW_GAS = 1_000_000


@dataclass
class PairState:
    owner: bytes
    first_token: str
    second_token: str
    first_reserve: int
    second_reserve: int
    lp_supply: int
    state: str = "Active"  # Inactive | Active | PartialActive (ABI enum State)


class PairContract(AbiContract):
    """Constant-product pair with a 0.3 % fee; `pause`/`resume` (owner) or `set_paused` (admin API)."""

    name = "xexchange-pair"
    abi_file = PAIR_ABI_PATH
    gas_table = PAIR_GAS
    default_gas = VIEW_GAS

    def __init__(
        self,
        owner: bytes,
        first_token: str,
        second_token: str,
        first_reserve: int = 0,
        second_reserve: int = 0,
        *,
        active: bool = True,
    ) -> None:
        super().__init__()
        self.state = PairState(
            owner=owner,
            first_token=first_token,
            second_token=second_token,
            first_reserve=first_reserve,
            second_reserve=second_reserve,
            lp_supply=math.isqrt(first_reserve * second_reserve),
            state="Active" if active else "Inactive",
        )

    @property
    def owner(self) -> bytes:
        return self.state.owner

    def is_paused(self) -> bool:
        return self.state.state != "Active"

    def set_paused(self, paused: bool) -> None:
        """Pause or resume outside a transaction (localnet admin API)."""
        self.state.state = "Inactive" if paused else "Active"

    def sync_reserves(self, first_reserve: int, second_reserve: int) -> None:
        """Set the reserves to the balances the pair account was given (genesis, outside a transaction)."""
        self.state.first_reserve = first_reserve
        self.state.second_reserve = second_reserve
        self.state.lp_supply = math.isqrt(first_reserve * second_reserve)

    def amount_out(self, token_in: str, amount_in: int) -> int:
        reserve_in, reserve_out = self._reserves(token_in)
        with_fee = amount_in * (FEE_DENOMINATOR - TOTAL_FEE)
        return with_fee * reserve_out // (reserve_in * FEE_DENOMINATOR + with_fee) if with_fee else 0

    def _reserves(self, token_in: str) -> tuple[int, int]:
        s = self.state
        if token_in == s.first_token:
            return s.first_reserve, s.second_reserve
        if token_in == s.second_token:
            return s.second_reserve, s.first_reserve
        raise ContractError(ERR_UNKNOWN_TOKEN)

    def _ep_swap_tokens_fixed_input(self, ctx: CallContext, token_out: str, amount_out_min: int) -> list[Any]:
        s = self.state
        if s.state != "Active":
            raise ContractError(ERR_SWAP_VENUE_PAUSED)
        esdt = ctx.esdt_payments()
        if len(esdt) != 1 or ctx.egld_value or esdt[0].token not in (s.first_token, s.second_token):
            raise ContractError(ERR_BAD_PAYMENT_TOKEN)
        token_in, amount_in = esdt[0].token, esdt[0].amount
        if token_out not in (s.first_token, s.second_token) or token_out == token_in:
            raise ContractError(ERR_UNKNOWN_TOKEN)
        if amount_in <= 0:
            raise ContractError(ERR_ZERO_AMOUNT)
        out = self.amount_out(token_in, amount_in)
        if out == 0:
            raise ContractError(ERR_ZERO_OUTPUT)
        if out < amount_out_min:
            raise ContractError(ERR_SLIPPAGE_EXCEEDED)
        reserve_in, reserve_out = self._reserves(token_in)
        if out >= reserve_out:
            raise ContractError(ERR_INSUFFICIENT_LIQUIDITY)
        reserve_in, reserve_out = reserve_in + amount_in, reserve_out - out
        if token_in == s.first_token:
            s.first_reserve, s.second_reserve = reserve_in, reserve_out
        else:
            s.second_reserve, s.first_reserve = reserve_in, reserve_out
        ctx.transfer(ctx.caller, token_out, out)
        self.emit(
            ctx,
            "swap",
            caller=ctx.caller,
            token_in=token_in,
            token_out=token_out,
            amount_in=amount_in,
            amount_out=out,
            reserve_in_after=reserve_in,
            reserve_out_after=reserve_out,
        )
        return [{"token_identifier": token_out, "token_nonce": 0, "amount": out}]

    def _ep_pause(self, ctx: CallContext) -> None:
        self.state.state = "Inactive"
        self.emit(ctx, "stateChanged", state="Inactive")

    def _ep_resume(self, ctx: CallContext) -> None:
        self.state.state = "Active"
        self.emit(ctx, "stateChanged", state="Active")

    def _view_get_reserves_and_total_supply(self, now_ms: int) -> list[Any]:
        return [self.state.first_reserve, self.state.second_reserve, self.state.lp_supply]

    def _view_get_amount_out(self, now_ms: int, token_in: str, amount_in: int) -> list[Any]:
        return [self.amount_out(token_in, amount_in)]

    def _view_get_state(self, now_ms: int) -> list[Any]:
        return [self.state.state]

    def _view_get_first_token_id(self, now_ms: int) -> list[Any]:
        return [self.state.first_token]

    def _view_get_second_token_id(self, now_ms: int) -> list[Any]:
        return [self.state.second_token]

    def _view_get_total_fee_percent(self, now_ms: int) -> list[Any]:
        return [TOTAL_FEE]

    def snapshot(self) -> dict[str, Any]:
        s = self.state
        return {
            "name": self.name,
            "owner": address_of(s.owner).to_bech32(),
            "state": s.state,
            "firstToken": s.first_token,
            "secondToken": s.second_token,
            "firstReserve": str(s.first_reserve),
            "secondReserve": str(s.second_reserve),
            "lpSupply": str(s.lp_supply),
        }


@dataclass
class WrapperState:
    owner: bytes
    wegld_token: str
    locked_egld: int


class WrapperContract(AbiContract):
    """EGLD <-> WEGLD at 1:1."""

    name = "egld-esdt-swap"
    abi_file = WRAPPER_ABI_PATH
    gas_table = WRAPPER_GAS
    default_gas = VIEW_GAS

    def __init__(self, owner: bytes, wegld_token: str, locked_egld: int = 0) -> None:
        super().__init__()
        self.state = WrapperState(owner=owner, wegld_token=wegld_token, locked_egld=locked_egld)

    @property
    def owner(self) -> bytes:
        return self.state.owner

    def sync_locked_egld(self, amount: int) -> None:
        """Set the locked EGLD to the wrapper account's EGLD balance (genesis, outside a transaction)."""
        self.state.locked_egld = amount

    def _ep_wrap_egld(self, ctx: CallContext) -> list[Any]:
        amount = ctx.egld_value
        if amount <= 0:
            raise ContractError(ERR_ZERO_AMOUNT)
        self.state.locked_egld += amount
        ctx.transfer(ctx.caller, self.state.wegld_token, amount)
        return [{"token_identifier": self.state.wegld_token, "token_nonce": 0, "amount": amount}]

    def _ep_unwrap_egld(self, ctx: CallContext) -> None:
        amount = ctx.single_esdt(self.state.wegld_token)
        if amount <= 0:
            raise ContractError(ERR_ZERO_AMOUNT)
        ctx.transfer(ctx.caller, EGLD, amount)  # fails with `insufficient funds` beyond the EGLD held
        self.state.locked_egld = max(0, self.state.locked_egld - amount)

    def _view_get_locked_egld_balance(self, now_ms: int) -> list[Any]:
        return [self.state.locked_egld]

    def _view_get_wrapped_egld_token_id(self, now_ms: int) -> list[Any]:
        return [self.state.wegld_token]

    def snapshot(self) -> dict[str, Any]:
        s = self.state
        return {
            "name": self.name,
            "owner": address_of(s.owner).to_bech32(),
            "wegldToken": s.wegld_token,
            "lockedEgld": str(s.locked_egld),
        }
