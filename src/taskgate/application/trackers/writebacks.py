"""Status write-back to an external tracker, through the durable outbox of domain/writebacks.py.

The transition that changes a tracker task's status writes the owed row in its own commit
(`SessionService._follow_task_and_plan`). `TrackerWriteBack.after` then tries it at once, so a CLI command
or tool call that moved the task says right away when the tracker refused (a warning on its result; the
transition stands). What failed is retried with backoff by `WritebackService.run_due`, which `taskgate serve`
(the sweeper's loop) and `taskgate tracker retry` call; after MAX_ATTEMPTS it is `failed` and waits for an
operator to retry or dismiss it. `taskgate tracker status` and the `tracker_status` tool list what is open.

How two workers never write the same row twice: an attempt starts with `claim`, a compare-and-swap on the
row's attempt count that also moves its due time past the call's timeout (a lease). A worker that loses the
swap leaves the row alone; a worker that dies mid-call leaves a row that becomes due again when its lease
ends. Only the newest open row of a task is written; older ones are superseded first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath, NoEffects
from taskgate.application.trackers.ports import TrackerProvider
from taskgate.application.trackers.routing import Trackers, polled
from taskgate.domain import writebacks as wb
from taskgate.domain.entities import TaskStatus, task_status_for
from taskgate.domain.errors import InvalidInput, TaskgateError
from taskgate.domain.states import SessionState
from taskgate.domain.writebacks import Writeback

LEASE = timedelta(minutes=2)  # longer than any bd call (timeout_s), so a live attempt is never taken over


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt at a row did: `ok`, or bd's own error."""

    writeback: Writeback
    ok: bool
    error: str | None = None


class WritebackService:
    """Runs owed write-backs, and lets operators see, retry and dismiss them."""

    def __init__(self, uow: UnitOfWorkFactory, clock: Clock, trackers: Trackers | TrackerProvider | None) -> None:
        self._uow, self._clock = uow, clock
        self._trackers = trackers if isinstance(trackers, Trackers) else Trackers.single(trackers)

    async def run_task(self, task_id: str) -> Attempt | None:
        """Write the task's newest owed status now (older owed rows are superseded). None: nothing was due."""
        async with self._uow(write=False) as uow:
            rows = await uow.writebacks.list(states=[wb.PENDING], task_ids=[task_id], limit=1)
        return await self._attempt(rows[0]) if rows else None

    async def run_due(self, limit: int = 100) -> list[Attempt]:
        """Every row due now, newest per task only: what the sweeper's loop runs."""
        async with self._uow(write=False) as uow:
            due = await uow.writebacks.due(self._clock.now(), limit)
        newest: dict[str, Writeback] = {}
        for row in due:
            newest[row.task_id] = row  # ascending ids: the last one of a task is its newest
        return [attempt for row in newest.values() if (attempt := await self._attempt(row)) is not None]

    async def retry(self, writeback_id: int, actor: str) -> Attempt:
        """An operator's retry of a failed (or waiting) row: due now with a fresh series of attempts, tried at once.

        Raises: WritebackNotFound; InvalidInput when the row is done, dismissed or superseded.
        """
        await self._move(writeback_id, wb.OPEN_STATES, wb.PENDING, actor, "tracker.writeback_retried")
        async with self._uow(write=False) as uow:
            row = await uow.writebacks.get(writeback_id)
        return await self._attempt(row) or Attempt(row, False, "another worker is writing it right now")

    async def dismiss(self, writeback_id: int, actor: str, reason: str) -> Writeback:
        """An operator gives up on a row (the tracker was fixed by hand, say). Raises: as `retry`."""
        if not reason.strip():
            raise InvalidInput("dismissing a write-back needs a reason (--reason)")
        return await self._move(writeback_id, wb.OPEN_STATES, wb.DISMISSED, actor, "tracker.writeback_dismissed",
                                reason=reason)  # fmt: skip

    async def open_rows(self, task_ids: Sequence[str] | None = None, limit: int = 100) -> list[Writeback]:
        """Pending and failed rows (of these tasks), newest first: what the tracker still has wrong."""
        async with self._uow(write=False) as uow:
            return await uow.writebacks.list(states=wb.OPEN_STATES, task_ids=task_ids, limit=limit)

    async def rows(self, states: Sequence[str] | None = None, limit: int = 100) -> list[Writeback]:
        """Rows in `states` (every state when None), newest first. Raises: InvalidInput for an unknown state."""
        unknown = set(states or ()) - set(wb.STATES)
        if unknown:
            raise InvalidInput(f"unknown write-back state {sorted(unknown)[0]!r}; known: {', '.join(wb.STATES)}")
        async with self._uow(write=False) as uow:
            return await uow.writebacks.list(states=states, limit=limit)

    # -- internals ---------------------------------------------------------------------------------------------

    async def _move(self, writeback_id: int, from_states, state: str, actor: str, event: str, **extra) -> Writeback:
        now = self._clock.now()
        async with self._uow(write=True) as uow:
            row = await uow.writebacks.get(writeback_id)
            if not await uow.writebacks.set_state(writeback_id, from_states, state, now, actor=actor):
                raise InvalidInput(f"write-back #{writeback_id} is {row.state}; only pending or failed ones can be "
                                   "retried or dismissed")  # fmt: skip
            payload = {"actor": actor, "writeback": writeback_id, "task": row.task_id, "status": row.status, **extra}
            await uow.events.append(event, now, payload, row.session_id)
            changed = await uow.writebacks.get(writeback_id)
            await uow.commit()
            return changed

    async def _attempt(self, row: Writeback) -> Attempt | None:
        """Claim the row, run the tracker's command outside any transaction, record the outcome."""
        now = self._clock.now()
        async with self._uow(write=True) as uow:
            await uow.writebacks.supersede_older(row.task_id, row.id, now)
            claimed = await uow.writebacks.claim(row.id, row.attempts, now + LEASE, now)
            task = await uow.tasks.get(row.task_id, with_blockers=False)
            project = await uow.projects.get(row.project_id)
            await uow.commit()
        if not claimed:
            return None
        error = await self._write(project, task.external_id or task.id, row)
        return Attempt(await self._record(row, row.attempts + 1, error), error is None, error)

    async def _write(self, project, issue_id: str, row: Writeback) -> str | None:
        try:
            provider = self._trackers.of(project)
            if provider is None or provider.name != row.tracker:
                return f"no {row.tracker} tracker is configured ([tracker] kind) to write to"
            await provider.set_status(project, issue_id, TaskStatus(row.status), await self._words(row, provider))
        except TaskgateError as exc:
            return str(exc)
        return None

    async def _words(self, row: Writeback, provider: TrackerProvider) -> str:
        """What the tracker is told with the status: Beads keeps the transition's reason (bd close --reason); GitHub
        and Linear get a comment naming the session, the move, its reason and the pull request when there is one."""
        if not polled(provider):
            return row.reason
        pull = None
        if row.session_id is not None:
            async with self._uow(write=False) as uow:
                pull = await uow.pull_requests.get(row.session_id)
        return status_comment(row, pull.url if pull is not None else None)

    async def _record(self, row: Writeback, attempts: int, error: str | None) -> Writeback:
        """The attempt's outcome on the row (if it is still this attempt's); returns the row as it now is."""
        now = self._clock.now()
        if error is None:
            state, due = wb.DONE, None
        elif wb.gives_up(attempts):
            state, due = wb.FAILED, None
        else:
            state, due = wb.PENDING, now + wb.retry_delay(attempts)
        async with self._uow(write=True) as uow:
            if await uow.writebacks.finish(row.id, attempts, state, error, due, now) and error is not None:
                payload = {"tracker": row.tracker, "task": row.task_id, "status": row.status, "error": error,
                           "writeback": row.id, "attempts": attempts, "state": state}  # fmt: skip
                await uow.events.append("tracker.writeback_failed", now, payload, row.session_id)
            finished = await uow.writebacks.get(row.id)
            await uow.commit()
            return finished


class TrackerWriteBack(NoEffects):
    """The session effect: after a transition that owes the tracker a status, write it at once."""

    def __init__(self, writebacks: WritebackService) -> None:
        self._writebacks = writebacks

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        if _changed_status(result) is None:
            return NOTHING
        attempt = await self._writebacks.run_task(result.session.task_id)
        if attempt is None or attempt.ok:
            return NOTHING
        return Aftermath(warning=f"tracker write-back of {attempt.writeback.task_id} → {attempt.writeback.status} "
                                 f"failed, will be retried (taskgate tracker status): {attempt.error}")  # fmt: skip


def status_comment(row: Writeback, pull_url: str | None) -> str:
    """The comment a polled tracker gets with a status write-back: which session moved the task, to what, why, and
    its pull request (the outcome, when the task is completed)."""
    words = {"in_progress": "started work on", "pending_review": "has work waiting for review on",
             "approved": "approved the work on", "merged": "merged the work on", "completed": "completed",
             "open": "gave back"}  # fmt: skip
    session = f"session {row.session_id}" if row.session_id else "taskgate"
    lines = [f"taskgate: {session} {words.get(row.status, 'moved')} this issue ({row.status})."]
    if row.reason:
        lines.append(f"Reason: {row.reason[:1000]}")
    if pull_url:
        lines.append(f"Pull request: {pull_url}")
    return "\n\n".join(lines)


def _changed_status(result: FireResult) -> TaskStatus | None:
    """The task status this transition set, or None when it left the task as it was (mirrors the engine)."""
    record = result.record
    before = SessionState(record.from_state) if record.from_state else None
    status = task_status_for(SessionState(record.to_state), before)
    if status is None or (before is not None and status == task_status_for(before, None)):
        return None
    return status
