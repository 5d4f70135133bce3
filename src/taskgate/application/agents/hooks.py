"""The project's worktree hooks around each agent's process (`[hooks]` before_agent and after_agent, run by
application/workspaces/hooks.py through the RunHooks port): each raced against the agent's stop, so a cancel never
waits on a hook, nor leaves one running in a worktree that is being removed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import suppress

from taskgate.application.agents.ports import RunHooks
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.entities import Agent, Session
from taskgate.domain.errors import HookFailed, TaskgateError


class AgentHooks:
    """The hook call-outs of the agent supervisor (`_hooks` is set by `AgentService.use_hooks`)."""

    _hooks: RunHooks | None
    _sessions: SessionService

    async def _before_agent_hook(self, session: Session, agent: Agent, stop: asyncio.Event) -> None:
        """The project's `before_agent` hook, just before the agent's process starts; a stop asked for meanwhile ends
        the hook (its process group killed) and the agent is not started. Raises: HookFailed."""
        if self._hooks is None:
            return
        if not await _until_stopped(self._hooks.before_agent(session, agent.id), stop):
            raise HookFailed("not started: stopped while its before_agent hook ran", "before_agent")

    async def _after_agent_hook(self, agent: Agent, stop: asyncio.Event) -> None:
        """The project's `after_agent` hook, for an agent whose process ended by itself, before its end is recorded
        (so the run's conclusion sees what the hook did). A stop asked for meanwhile ends the hook (its process group
        killed): the worktree is about to be removed. Its failure is recorded by the hook, never raised here."""
        if self._hooks is None or not agent.pid or stop.is_set():
            return
        try:
            session = await self._sessions.get(agent.session_id)
        except TaskgateError:
            return
        with suppress(TaskgateError):
            await _until_stopped(self._hooks.after_agent(session, agent.id), stop)


async def _until_stopped(work: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await `work` unless `stop` is set first (then it is cancelled, and awaited while it cleans up: a hook's
    process group is killed). True when it finished; its exception, if any, is raised. This task's own cancellation
    cancels `work` too."""
    job, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({job, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not job.done():
            job.cancel()
            with suppress(asyncio.CancelledError):
                await job
    if job.cancelled():
        return False
    job.result()
    return True
