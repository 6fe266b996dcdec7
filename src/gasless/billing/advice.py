"""What a refusal on the paying path tells the account: what it holds (plan, credits, escrow) and the one
command that lets it relay.

Credits pay for relays only through the pay-as-you-go escrow (or, with auto top-up, by refilling it as the
relays are settled); a deposit alone does not let an account relay. Every refusal of that path
(`NO_ENTITLEMENT`, `QUOTA_EXHAUSTED`) says so in its `detail`, with the `gasless` command to run, and
repeats the figures in `details` (`account`, `creditsMicro`, `escrowMicro`, `runningPlan`, `nextCommand`).
The texts never use the words a starter-kit client reads as commands of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

USDC_MICRO = 1_000_000
PEM = "<wallet.pem>"  # the account's own wallet: it signs the flag or deposit transaction


def usdc(micro: int) -> str:
    """Micro-USDC as an exact USDC figure: `10`, `2.5`, `0.000001`."""
    whole, fraction = divmod(int(micro), USDC_MICRO)
    if not fraction:
        return str(whole)
    return f"{whole}.{fraction:06d}".rstrip("0")


@dataclass(frozen=True)
class Holdings:
    """What the paying account holds, as the contract's account view said when the relay was judged."""

    account: str
    plan: str | None  # the running plan's tier name; None without a running plan
    credits_micro: int
    escrow_micro: int
    payg_enabled: bool
    auto_topup: bool
    deposit_min_micro: int = USDC_MICRO
    exists: bool = True  # False: the address has no account in the contract

    @classmethod
    def none(cls, account: str, deposit_min_micro: int) -> Holdings:
        """An address without an account in the contract."""
        return cls(account, None, 0, 0, False, False, deposit_min_micro, exists=False)

    def as_json(self) -> dict[str, Any]:
        """Stored with a billed relay's decision, for the commit point's refusals (`from_json`)."""
        return {
            "plan": self.plan,
            "credits": self.credits_micro,
            "escrow": self.escrow_micro,
            "payg": self.payg_enabled,
            "autoTopup": self.auto_topup,
            "depositMin": self.deposit_min_micro,
        }

    @classmethod
    def from_json(cls, account: str, stored: Any) -> Holdings | None:
        if not isinstance(stored, dict):
            return None
        return cls(
            account,
            stored.get("plan"),
            int(stored.get("credits") or 0),
            int(stored.get("escrow") or 0),
            bool(stored.get("payg")),
            bool(stored.get("autoTopup")),
            int(stored.get("depositMin") or USDC_MICRO),
        )

    def sentence(self) -> str:
        """`erd1... has no running plan, 10 USDC of credits and 0 USDC in the pay-as-you-go escrow
        (pay-as-you-go off)`."""
        if not self.exists:
            return (
                f"{self.account} has no account in the contract: no plan, no credits and no pay-as-you-go "
                "escrow"
            )
        plan = (
            f"a running {self.plan} plan"
            if self.plan
            else "a running plan"
            if self.plan == ""
            else "no running plan"
        )
        if self.payg_enabled:
            payg = "pay-as-you-go on, auto top-up " + ("on" if self.auto_topup else "off")
        else:
            payg = "pay-as-you-go off"
        return (
            f"{self.account} has {plan}, {usdc(self.credits_micro)} USDC of credits and "
            f"{usdc(self.escrow_micro)} USDC in the pay-as-you-go escrow ({payg})"
        )

    def next_step(self, *, price_above_max: bool = False) -> tuple[str, str]:
        """(the command, what it does): the one command that lets the account relay."""
        if price_above_max:
            return (
                f"gasless flags --pem {PEM} --payg-max-price 0",
                "lifts the account's cap on the pay-as-you-go price",
            )
        if self.credits_micro > 0:
            amount = usdc(self.credits_micro)
            return (
                f"gasless flags --pem {PEM} --payg --payg-budget {amount}",
                f"moves {amount} USDC of credits into the pay-as-you-go escrow, which pays for relays",
            )
        amount = usdc(max(self.deposit_min_micro, 1))
        return (
            f"gasless x402 topup --pem {PEM} --amount {amount} --to-escrow",
            f"pays {amount} USDC as credits and moves them into the pay-as-you-go escrow",
        )

    def details(self, *, price_above_max: bool = False) -> dict[str, Any]:
        command, _ = self.next_step(price_above_max=price_above_max)
        return {
            "account": self.account,
            "runningPlan": self.plan,
            "creditsMicro": self.credits_micro,
            "escrowMicro": self.escrow_micro,
            "nextCommand": command,
        }

    def advice(self, *, price_above_max: bool = False) -> str:
        command, effect = self.next_step(price_above_max=price_above_max)
        return f"run `{command}`: it {effect}"
