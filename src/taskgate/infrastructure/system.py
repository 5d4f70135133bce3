"""The real clock and id generator."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime


class SystemClock:
    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def now(self) -> datetime:
        return datetime.now(UTC)


class UuidGenerator:
    def new_session_id(self) -> str:
        return str(uuid.uuid4())
