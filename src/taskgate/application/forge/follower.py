"""The forge loop: open pull requests are looked at, and each look is acted on by the node holding the session.

Two halves, because they belong to different processes in a cluster:

- **Looking** (`observe_due`) is done once for all nodes, by the holder of the `forge` lease (the sweeper's way,
  docs/nodes.md): each open pull request every `poll_s`, or at once when a webhook poked it. A look is stored on the
  pull request's row by compare-and-swap on when taskgate last published it (`store_observation`), so a look that
  raced a push (or a reopening) is dropped instead of undoing it.
- **Acting** (`act_held`) is done by every node for the sessions it holds (only the holder may move a session): the
  newest look, taken after the last push, is decided (domain/forge.py `decide`) into one trigger, fired with the
  version the decision read. A session that moved meanwhile refuses it (ConcurrentModification), and the next look
  decides again. The same decision is not fired twice on one version (a refused merge waits for a new look).

Polling is the fallback and the floor: with webhooks, looks happen when the forge says something changed, and the
poll interval can be long. Both go through the same `observe` (conditional requests, ETags: an unchanged pull
request costs 304s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from taskgate.application.forge.codec import decode_observation, encode_observation
from taskgate.application.forge.ports import ForgeDirectory, ForgeLink, PullRequestRecord
from taskgate.application.forge.publish import ForgePublisher, approved_head, forge_data, owed, with_forge_round
from taskgate.application.nodes.heartbeats import NodeService
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.entities import Session
from taskgate.domain.errors import ForgeError, TaskgateError
from taskgate.domain.forge import (
    Observation,
    Rounds,
    Step,
    StepKind,
    ci_instructions,
    decide,
    rebase_instructions,
    status_of,
)
from taskgate.domain.states import SessionState, Trigger

_log = logging.getLogger("taskgate.forge")
FORGE_LEASE = "forge"
_LOOKED_AT = frozenset({SessionState.AWAITING_MERGE, SessionState.VERIFYING})
# how long a transition's own publish (push, open or update the pull request) is left to finish before the forge
# loop takes it over: a push of a large branch over a slow link takes seconds, not minutes
_EFFECT_GRACE = timedelta(seconds=60)


@dataclass(slots=True)
class FollowReport:
    """What one pass did: looks taken, triggers fired (`session: trigger`), errors."""

    looked: int = 0
    fired: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ForgeFollower:
    """Looks at open pull requests (one process per cluster) and acts on the looks (each session's node)."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        publisher: ForgePublisher,
        forges: ForgeDirectory,
        clock: Clock,
        nodes: NodeService | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self._uow, self._sessions, self._publisher, self._forges = uow, sessions, publisher, forges
        self._clock, self._nodes, self.tick_s = clock, nodes, tick_s
        self._wake = asyncio.Event()
        self._acted: dict[str, str] = {}  # session → the decision last fired on its version and look
        # the first pass after this process took the lease looks at every pull request: what changed while no one
        # looked (a restart, a node down: webhooks sent then are lost, GitHub does not resend them) is seen at once
        self._caught_up = False

    async def pull_request(self, session_id: str) -> PullRequestRecord | None:
        """The session's pull request row (what `session show`, MCP and the console show), or None."""
        async with self._uow(write=False) as uow:
            return await uow.pull_requests.get(session_id)

    def wake(self) -> None:
        """Look and act now (a webhook delivery), not at the next tick."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Follow every `tick_s` (or when woken) until `stop` is set; a failed pass is logged and the loop goes on.
        Stopping gives the lease up at once, so another node need not wait for it to expire."""
        try:
            while not stop.is_set():
                try:
                    report = await self.follow_once()
                    for line in report.fired:
                        _log.info("forge: %s", line)
                    for line in report.errors:
                        _log.warning("forge: %s", line)
                except Exception:  # a background loop outlives one bad pass; CancelledError still ends it
                    _log.exception("forge pass failed")
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_either(stop, self._wake), self.tick_s)
        finally:
            if self._nodes is not None:
                with contextlib.suppress(TaskgateError):
                    await self._nodes.release(FORGE_LEASE)

    async def follow_once(self) -> FollowReport:
        """One pass: look at what is due (holding the lease), then act on the sessions held here."""
        report = FollowReport()
        if await self._my_turn():
            await self.observe_due(report)
            self._caught_up = True
        else:
            self._caught_up = False  # another holds the lease: if it comes back here, catch up again
        await self.act_held(report)
        return report

    async def _my_turn(self) -> bool:
        if self._nodes is None:
            return True
        lease = await self._nodes.hold(FORGE_LEASE, self._nodes.lease_s + self.tick_s)
        return lease.holder == self._nodes.holder

    # -- looking ---------------------------------------------------------------------------------------------------

    async def observe_due(self, report: FollowReport) -> None:
        """Look at each pull request that is due: poked by a webhook, or not looked at for `poll_s`."""
        for record, session, link in await self._following():
            if session.state not in _LOOKED_AT or record.number is None or not self._due(record, link):
                continue
            if record.poke:  # cleared before the look: a delivery arriving during it pokes again (no lost wake-up)
                async with self._uow(write=True) as uow:
                    await uow.pull_requests.unpoke(session.id)
                    await uow.commit()
            began = self._clock.now()  # the look's time is when it began: a change after that is not in it
            try:
                seen = await link.api.observe(record.number)
            except ForgeError as exc:
                report.errors.append(f"session {session.id}: PR #{record.number}: {exc}")
                continue
            status = status_of(seen, pushed=record.pushed, approved=approved_head(session), limits=link.limits)
            async with self._uow(write=True) as uow:
                stored = await uow.pull_requests.store_observation(
                    session.id, record.pushed_at, encode_observation(seen), status.value, began
                )
                await uow.commit()
            report.looked += int(stored)

    def _due(self, record: PullRequestRecord, link: ForgeLink) -> bool:
        if not self._caught_up:
            return True
        if record.poke or record.observed_at is None:
            return True
        return self._clock.now() - record.observed_at >= timedelta(seconds=link.poll_s)

    def _retry_due(self, record: PullRequestRecord, link: ForgeLink) -> bool:
        """Whether a publish that failed is tried again: `poll_s` after the failure, whatever a webhook says."""
        return record.updated_at is None or self._clock.now() - record.updated_at >= timedelta(seconds=link.poll_s)

    async def _following(self) -> list[tuple[PullRequestRecord, Session, ForgeLink]]:
        async with self._uow(write=False) as uow:
            records = await uow.pull_requests.following()
            found, projects = [], {}
            for record in records:
                session = await uow.sessions.get(record.session_id)
                if session.project_id not in projects:  # one read per project and pass, not per pull request
                    projects[session.project_id] = await uow.projects.get(session.project_id)
                link = self._forges.for_project(projects[session.project_id])
                if link is not None:
                    found.append((record, session, link))
        return found

    # -- acting ----------------------------------------------------------------------------------------------------

    async def act_held(self, report: FollowReport) -> None:
        """Act on the newest look of each session this node holds."""
        for record, session, link in await self._following():
            if not self._sessions.holds(session):
                continue
            try:
                if owed(session, record):  # a push or pull request call that failed, or was cut off: again
                    if record.error and not self._retry_due(record, link):
                        continue  # it failed less than `poll_s` ago: the forge gets a rest
                    if not record.error and self._clock.now() - session.updated_at < _EFFECT_GRACE:
                        continue  # the transition's own effect is publishing it now (maybe in the CLI's process)
                    project, _ = await self._publisher.link(session.project_id)
                    await self._publisher.publish(session, project, link)
                    continue
                cmd = await self._next(record, session, link)
            except ForgeError as exc:
                report.errors.append(f"session {session.id}: {exc}")
                continue
            if cmd is None:
                continue
            key = f"{session.version}:{cmd.trigger}:{record.observed_at}"
            if self._acted.get(session.id) == key:
                continue  # fired on this version and look already, and refused: wait for a new look
            self._acted[session.id] = key
            try:
                await self._sessions.fire(cmd)
                report.fired.append(f"session {session.id}: {cmd.trigger}: {cmd.reason}")
                async with self._uow(write=True) as uow:  # what happened last, for `session show` and the console
                    await uow.pull_requests.note(session.id, f"{cmd.trigger}: {cmd.reason}", self._clock.now())
                    await uow.commit()
            except TaskgateError as exc:
                report.errors.append(f"session {session.id}: {cmd.trigger} refused: {exc}")

    async def _next(self, record: PullRequestRecord, session: Session, link: ForgeLink) -> FireTrigger | None:
        """The trigger the session's newest look asks for, or None."""
        if session.state == SessionState.VERIFYING and forge_data(session).get("round"):
            done = forge_data(session)["round"]
            return self._fire(session, Trigger.UPDATE_PR, f"{done} round done: its fix pushed to PR #{record.number}")
        if session.state not in _LOOKED_AT or record.observation is None or not _fresh(record, session):
            return None
        seen = decode_observation(record.observation)
        rounds = Rounds(**{k: int(v) for k, v in (forge_data(session).get("rounds") or {}).items()})
        step = decide(seen, state=session.state.value, pushed=record.pushed, approved=approved_head(session),
                      rounds=rounds, limits=link.limits)  # fmt: skip
        if not step.acts:
            return None
        return await self._command(step, seen, record, session, link)

    async def _command(
        self, step: Step, seen: Observation, record: PullRequestRecord, session: Session, link: ForgeLink
    ) -> FireTrigger:
        if step.kind == StepKind.FORGE_MERGED:
            merge = {"commit": seen.pull.merge_commit, "into": f"{record.base}", "via": "forge",
                     "pull_request": seen.pull.number, "by": seen.pull.merged_by}  # fmt: skip
            return self._fire(session, Trigger.FORGE_MERGED, step.reason, changes={"state_data": {"merge": merge}})
        if step.kind == StepKind.ASK_OPERATOR:
            return self._fire(session, Trigger.REVERIFY, step.reason)
        if step.kind == StepKind.MERGE:
            return self._fire(session, Trigger.MERGE, step.reason)
        instructions = step.instructions
        if step.kind == StepKind.CI_FAILED:
            tails = tuple([(c, await link.api.log_tail(c, link.log_tail_lines)) for c in step.failed_checks])
            instructions = ci_instructions(seen.pull, tails)
        elif step.kind == StepKind.REBASE:
            project, _ = await self._publisher.link(session.project_id)
            base = await link.pushes.fetch(project.root_path, record.base)
            instructions = rebase_instructions(seen.pull, base)
        cmd = self._fire(session, Trigger(step.kind.value), step.reason)
        return with_forge_round(cmd, session, step.kind.value, instructions)

    def _fire(self, session: Session, trigger: Trigger, reason: str, **extra: Any) -> FireTrigger:
        return FireTrigger(session.id, trigger.value, "forge", reason=reason, expected_version=session.version, **extra)


def _fresh(record: PullRequestRecord, session: Session) -> bool:
    """Whether the look began after taskgate's last push (an older one shows a head that is no longer ours) and
    after the session's last transition (an approval that reopens a closed pull request must not be answered by
    the look that saw it closed, in the moment before its push)."""
    if record.observed_at is None:
        return False
    return record.observed_at >= max(filter(None, (record.pushed_at, session.updated_at)))


async def _either(a: asyncio.Event, b: asyncio.Event) -> None:
    """Return when either event is set."""
    tasks = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
