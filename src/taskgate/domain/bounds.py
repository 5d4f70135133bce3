"""The ranges of the integers a caller may pass (versions, ids, priorities, row limits), in one place.

Versions and ids live in INTEGER columns, 32-bit on PostgreSQL (64-bit on SQLite), so 1..2**31-1 is what
both can hold. A number outside its range names nothing and must be refused as invalid input before it
reaches a driver, which would fail in its own words instead (sqlite3's OverflowError past 64 bits, asyncpg's
"value out of int32 range" past 32).

Who checks: the application's commands check their own integers when they are built (`FireTrigger`,
`Decide`, `AddTask`, `ImportBeads`) and the read use cases check theirs on entry, so every caller (the CLI,
the MCP tools, a script) is refused the same way before any I/O. The MCP tools also put these ranges into
their input schemas, so a client can see them before it calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskgate.domain.errors import InvalidInput

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class IntRange:
    """The integers from `low` to `high`, both included."""

    low: int
    high: int

    def check(self, name: str, value: int | None) -> None:
        """Refuse `value` (None: not given, nothing to check) when it is outside the range.

        Raises: InvalidInput naming the parameter and the range.
        """
        if value is not None and not self.low <= value <= self.high:
            shown = value if value.bit_length() <= 128 else "a larger number"  # str() of a huge int raises
            raise InvalidInput(f"{name} must be from {self.low} to {self.high}, got {shown}")


VERSIONS = IntRange(1, INT32_MAX)
"""A session's version: 1 when it is created, one more with every change."""
IDS = IntRange(1, INT32_MAX)
"""Integer ids (plans, projects): assigned from 1 up."""
PRIORITIES = IntRange(0, 4)
"""A task's priority: 0 is the most urgent."""
ROW_LIMITS = IntRange(1, 100_000)
"""How many rows a history or audit query may ask for."""

PAGE_SIZES = IntRange(1, 1_000)
"""How many items one page of a listing may hold (session_list)."""

OFFSETS = IntRange(0, INT32_MAX)
"""Where a page of a listing starts."""
