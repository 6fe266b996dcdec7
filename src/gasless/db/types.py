"""Column types that store the same Python values exactly on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from sqlalchemy import JSON, BigInteger, Dialect, Integer, Numeric, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator, TypeEngine

ATTO_DIGITS = 78
ATTO_MAX = 10**ATTO_DIGITS - 1  # what NUMERIC(78,0) holds; covers uint256 (2**256 - 1 has 78 digits)
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_HASH32 = re.compile(r"[0-9a-fA-F]{64}")


def _strict_int(value: Any, kind: str, minimum: int, maximum: int) -> int:
    # bool is an int subclass; a True/False amount is always a bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{kind} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{kind} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{kind} must be <= {maximum}, got {value}")
    return int(value)


class Atto(TypeDecorator[int]):
    """Non-negative native-coin amount in atto: NUMERIC(78,0) on PostgreSQL, decimal TEXT on SQLite."""

    impl = Numeric
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(ATTO_DIGITS, 0)

    def __repr__(self) -> str:
        # Autogenerate renders types by repr; the precision is fixed, so no arguments.
        return "Atto()"

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            # SQLite's NUMERIC goes through REAL above 2**63 and loses digits.
            return dialect.type_descriptor(Text())
        return dialect.type_descriptor(Numeric(ATTO_DIGITS, 0, asdecimal=True))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        amount = _strict_int(value, "atto amount", 0, ATTO_MAX)
        if dialect.name == "sqlite":
            # Zero-padded to a fixed width so SQL comparisons and ORDER BY on the text match numeric order.
            return f"{amount:0{ATTO_DIGITS}d}"
        return Decimal(amount)

    def process_literal_param(self, value: Any, dialect: Dialect) -> Any:
        return self.process_bind_param(value, dialect)

    def process_result_value(self, value: Any, dialect: Dialect) -> int | None:
        if value is None:
            return None
        return int(value)

    @property
    def python_type(self) -> type[int]:
        return int


class Micro(TypeDecorator[int]):
    """Integer amount in micro-USDC (signed 64-bit)."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else _strict_int(value, "micro amount", INT64_MIN, INT64_MAX)

    def process_result_value(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else int(value)

    @property
    def python_type(self) -> type[int]:
        return int


class UnixMs(TypeDecorator[int]):
    """Unix time in milliseconds as an int (timestamps are never datetimes)."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else _strict_int(value, "unix ms timestamp", 0, INT64_MAX)

    def process_result_value(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else int(value)

    @property
    def python_type(self) -> type[int]:
        return int


class Hash32(TypeDecorator[str]):
    """A 32-byte hash (transaction hash) as 64 lower-case hex characters."""

    impl = String(64)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or _HASH32.fullmatch(value) is None:
            raise ValueError(f"expected 64 hex characters, got {value!r}")
        return value.lower()

    def process_literal_param(self, value: Any, dialect: Dialect) -> str | None:
        return self.process_bind_param(value, dialect)

    @property
    def python_type(self) -> type[str]:
        return str


# JSON documents: JSONB on PostgreSQL, JSON (text) on SQLite.
JsonDoc: TypeEngine[Any] = JSON().with_variant(JSONB(), "postgresql")

# 64-bit surrogate keys; SQLite only autoincrements a column declared exactly INTEGER PRIMARY KEY.
BigId: TypeEngine[int] = BigInteger().with_variant(Integer(), "sqlite")
