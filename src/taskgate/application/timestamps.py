"""Reading timestamps that users and MCP clients type, the same way everywhere."""

from __future__ import annotations

from datetime import UTC, datetime

from taskgate.domain.errors import InvalidInput


def parse_timestamp(text: str) -> datetime:
    """ISO 8601; a timestamp without a zone is read as UTC.

    Raises: InvalidInput when it is malformed, or has no UTC equivalent (0001-01-01T00:00+14:00).
    """
    shown = text[:64]
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"malformed timestamp '{shown}': use ISO 8601, e.g. 2026-11-21T10:00:00Z") from None
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        value.astimezone(UTC)  # what the database stores
    except OverflowError:
        raise InvalidInput(f"timestamp '{shown}' is out of range once converted to UTC") from None
    return value
