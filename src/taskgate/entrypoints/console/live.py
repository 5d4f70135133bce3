"""Live updates for open console pages: one poller per process, however many browsers listen.

`ChangeFeed` reads the event log's high-water mark (every transition, decision and agent status change appends an
event) every `interval_s` while at least one page listens, and wakes the listeners when it moved. Each open page
holds one server-sent-events stream (`stream`) that says `changed` with the new mark; the page's script then
fetches its live part again. A page with scripts off still works: it shows what was true when it loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

HEARTBEAT_S = 15.0  # a comment line keeps proxies from closing an idle stream


class ChangeFeed:
    """Polls `read_mark` once for all listeners; `wait_past(mark)` returns the first mark greater than `mark`."""

    def __init__(self, read_mark: Callable[[], Awaitable[int]], interval_s: float = 0.2) -> None:
        self._read, self._interval = read_mark, interval_s
        self._mark = -1
        self._moved = asyncio.Condition()
        self._listeners = 0
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def stop(self) -> None:
        """The server is stopping: every waiting stream ends now (instead of holding the shutdown)."""
        self._stopped = True
        async with self._moved:
            self._moved.notify_all()
        await self.close()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def listeners(self) -> int:
        return self._listeners

    async def current(self) -> int:
        if self._mark < 0:
            self._mark = await self._read()
        return self._mark

    async def wait_past(self, mark: int, timeout: float) -> int:
        """The newest mark once it is past `mark`, or the current one after `timeout` seconds."""
        self._listeners += 1
        self._ensure_polling()
        try:
            async with self._moved:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._moved.wait_for(lambda: self._stopped or self._mark > mark), timeout)
                return self._mark
        finally:
            self._listeners -= 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _ensure_polling(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll(), name="taskgate-console-feed")

    async def _poll(self) -> None:
        while self._listeners > 0:
            try:
                mark = await self._read()
            except Exception:
                mark = self._mark
            if mark != self._mark:
                async with self._moved:
                    self._mark = mark
                    self._moved.notify_all()
            await asyncio.sleep(self._interval)


async def stream(
    feed: ChangeFeed, since: int, alive: Callable[[], Awaitable[bool]], heartbeat_s: float = HEARTBEAT_S
) -> AsyncIterator[str]:
    """Server-sent events: `changed` whenever the feed's mark moves past what this page has seen; a comment line
    every `heartbeat_s`; ends when `alive` says the page's sign-in ended (so a revoked token stops its streams)."""
    mark = since
    yield "retry: 2000\n\n"
    while not feed.stopped and await alive():
        newer = await feed.wait_past(mark, heartbeat_s)
        if feed.stopped:
            return
        if newer > mark:
            mark = newer
            yield f"event: changed\ndata: {mark}\n\n"
        else:
            yield ": still here\n\n"
