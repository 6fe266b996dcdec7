"""The pricing document and the tariff history, from the billing contract's views.

The document is rebuilt from fresh views at most every `ttl_ms` (3 000 ms) and served with `max-age=3`, so
what a client holds is never more than 6 000 ms older than the contract (docs/api-conventions.md,
"Caching"). The pending
`sender_fee_ru` is never published: `getConfig` reports the fee in force (an increase waits its notice).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gasless.billing.schedule import RU_SCHEDULE_V1, RU_SCHEDULE_VERSION
from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.core.errors import ApiError
from gasless.http.pages import CursorCodec, PageParams
from gasless.mirror.repository import MirrorRepository
from gasless.mirror.views import ContractMirror
from gasless.pricing.schemas import (
    PRICING_SCHEMA_VERSION,
    DepositBounds,
    HowToBuy,
    PricingDocument,
    PricingRateClass,
    PricingRateClasses,
    PricingTier,
    RuSchedule,
    RuScheduleStep,
    SenderFee,
    TariffEntry,
    TariffHistoryPage,
)

DOCUMENT_TTL_MS = 3_000
LISTING = "tariff-history"
# The one transaction field the RU schedule prices; see relay/checks.py (UNSUPPORTED_TX_FIELD).
FEE_RELEVANT_FIELDS = ["gasLimit"]
PREPARE_ROUTES = {
    "subscribe": "POST /v1/subscribe/prepare",
    "deposit": "POST /v1/deposit/prepare",
    "flags": "POST /v1/flags/prepare",
    "senders": "POST /v1/senders/prepare",
}


def text(value: Any) -> str:
    """A contract `bytes` value as text (tier names, function names)."""
    return bytes(value).decode("utf-8", errors="replace") if not isinstance(value, str) else value


def variant(value: Any) -> str:
    """An ABI enum value by its variant name (`Human`, `TierPrice`)."""
    return str(getattr(value, "__name__", value))


class PricingService:
    def __init__(
        self,
        mirror: ContractMirror,
        mirror_repo: MirrorRepository | None,
        cursors: CursorCodec,
        *,
        chain_id: str,
        payment_token: str,
        ttl_ms: int = DOCUMENT_TTL_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mirror = mirror
        self.mirror_repo = mirror_repo
        self.cursors = cursors
        self.chain_id = chain_id
        self.payment_token = payment_token
        self.ttl_ms = ttl_ms
        self.clock = clock
        self._document: tuple[float, PricingDocument] | None = None
        self._building: asyncio.Lock = asyncio.Lock()

    # The document ---------------------------------------------------------------------------------
    async def document(self, audience: str | None = None) -> PricingDocument:
        """The whole document, or its tiers of one audience (`human` or `agent`)."""
        document = await self._current()
        if audience is None:
            return document
        return document.model_copy(update={"tiers": [t for t in document.tiers if t.audience == audience]})

    async def changed_document(self) -> dict[str, Any]:
        """The document rebuilt now (the stream's `pricing` event after a tariff or schedule change)."""
        self._document = None
        return (await self._current()).model_dump(mode="json")

    async def tariff_entries(self) -> list[TariffEntry]:
        """Every tariff entry (the notice sources' view of tariff changes)."""
        return await self._tariff_entries()

    async def _current(self) -> PricingDocument:
        cached = self._document
        if cached is not None and cached[0] > self.clock():
            return cached[1]
        async with self._building:  # concurrent misses share one build
            cached = self._document
            if cached is not None and cached[0] > self.clock():
                return cached[1]
            try:
                document = await self._build()
            except (GatewayUnavailable, GatewayRejected) as exc:
                raise ApiError(
                    "UPSTREAM_UNAVAILABLE",
                    detail="the billing contract could not be read; retry shortly",
                    details={"retryAfterMs": 1_000},
                ) from exc
            self._document = (self.clock() + self.ttl_ms / 1000, document)
            return document

    async def _build(self) -> PricingDocument:
        if self.mirror.contract is None:
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="no billing contract is configured")
        config, tiers, classes = await asyncio.gather(
            self.mirror.fresh("getConfig"), self.mirror.fresh("getTiers"), self.mirror.fresh("getRateClasses")
        )
        config = config[0]
        return PricingDocument(
            schemaVersion=PRICING_SCHEMA_VERSION,
            policyVersion=int(config.policy_version),
            chainId=self.chain_id,
            ruPriceMicroUsdc=str(int(config.ru_price_micro)),
            tiers=[tier_entry(tier) for tier in _items(tiers)],
            rateClasses=PricingRateClasses(
                policyVersion=int(config.policy_version),
                classes=[rate_class_entry(rc) for rc in _items(classes)],
            ),
            ruSchedule=RuSchedule(
                version=RU_SCHEDULE_VERSION,
                steps=[
                    RuScheduleStep(maxGasLimit=str(ceiling), ru=str(ru)) for ceiling, ru in RU_SCHEDULE_V1
                ],
                feeRelevantFields=FEE_RELEVANT_FIELDS,
            ),
            deposit=DepositBounds(
                minMicroUsdc=str(int(config.deposit_min_micro)),
                maxMicroUsdc=str(int(config.deposit_max_micro)),
            ),
            senderFee=SenderFee(
                ru=str(int(config.sender_fee_ru)), microUsdc=str(int(config.sender_fee_micro))
            ),
            howToBuy=HowToBuy(
                freeOperations=[text(name) for name in config.free_operations],
                paymentToken=self.payment_token,
                contract=self.mirror.contract,
                prepare=PREPARE_ROUTES,
                x402="/.well-known/x402",
            ),
        )

    # The tariff history -----------------------------------------------------------------------------
    async def tariff_history(self, page: PageParams) -> TariffHistoryPage:
        """Newest first. The contract's `getTariffHistory` is the authority; the mirror's copy of it serves
        the page (read from the contract while the mirror has none yet)."""
        before: int | None = None
        if page.cursor is not None:
            position = self.cursors.open(page.cursor, LISTING, {})
            if not isinstance(position, int) or isinstance(position, bool):
                raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
            before = position
        entries = sorted(await self._tariff_entries(), key=lambda entry: entry.seq, reverse=True)
        if before is not None:
            entries = [entry for entry in entries if entry.seq < before]
        chosen = entries[: page.limit]
        more = len(entries) > page.limit
        cursor = self.cursors.mint(LISTING, {}, chosen[-1].seq) if more else None
        return TariffHistoryPage(items=chosen, nextCursor=cursor)

    async def _tariff_entries(self) -> list[TariffEntry]:
        stored = await self.mirror_repo.view("tariffHistory") if self.mirror_repo is not None else None
        if stored is not None:
            return [tariff_entry_of_plain(entry) for entry in _items(stored)]
        try:
            views = await self.mirror.fresh("getTariffHistory")
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="the billing contract could not be read") from exc
        return [tariff_entry_of_view(entry) for entry in _items(views)]


def _items(views: Any) -> list[Any]:
    """A variadic view's values (decoded as one list, or as the list of outputs)."""
    if isinstance(views, list) and len(views) == 1 and isinstance(views[0], list):
        return list(views[0])
    return list(views)


def tier_entry(tier: Any) -> PricingTier:
    return PricingTier(
        id=int(tier.id),
        name=text(tier.name),
        audience="agent" if variant(tier.audience).lower() == "agent" else "human",
        available=bool(tier.purchasable),
        rateClass=int(tier.rate_class),
        priceMicroUsdc=str(int(tier.price_micro)),
        includedRu=str(int(tier.included_ru)),
        periodMs=int(tier.period_ms),
        payg=bool(tier.payg),
    )


def rate_class_entry(rc: Any) -> PricingRateClass:
    return PricingRateClass(
        id=int(rc.id),
        ruPerSecond=str(int(rc.ru_per_sec)),
        ruBurst=str(int(rc.ru_burst)),
        gasPerSecondPerShard=str(int(rc.gas_per_sec_per_shard)),
        gasBurstPerShard=str(int(rc.gas_burst_per_shard)),
        maxGasLimit=str(int(rc.max_gas_limit)),
        ruPerHour=str(int(rc.ru_per_hour)),
    )


def tariff_entry_of_view(entry: Any) -> TariffEntry:
    return TariffEntry(
        seq=int(entry.seq),
        timestampMs=int(entry.timestamp_ms),
        effectiveMs=int(entry.effective_ms),
        kind=variant(entry.kind),
        subjectId=int(entry.subject_id),
        value=str(int(entry.value)),
        policyVersion=int(entry.policy_version),
    )


def tariff_entry_of_plain(entry: dict[str, Any]) -> TariffEntry:
    """An entry of the mirror's JSON-plain copy (camelCase members, enums by variant name)."""
    return TariffEntry(
        seq=int(entry["seq"]),
        timestampMs=int(entry["timestampMs"]),
        effectiveMs=int(entry["effectiveMs"]),
        kind=str(entry["kind"]),
        subjectId=int(entry["subjectId"]),
        value=str(int(entry["value"])),
        policyVersion=int(entry["policyVersion"]),
    )
