"""Running workflows: a session's stack of frames, driven step by step while the session is `executing`.

The stack lives in `sessions.workflow_stack` (frames: domain/workflows/run.py); every step attempt is a row
of `step_runs`. `drive` moves the top frame one step at a time until it has to wait: for agents to end, for a
person (an approval, checklist items), or for a retry's delay. Agents ending, decisions, checklist ticks,
stack edits and entering `executing` each `kick` the driver again; when the stack is empty, `work_complete`
fires.

How races are prevented. In this process one asyncio lock per session serialises the driver and every stack
edit (push, advance, back, break, restart, checklist ticks, approval answers). Every save of the stack is a
write unit that locks the session row and checks its version, and bumps it: a second process (the CLI next to
`serve`) that read the stack before loses with ConcurrentModification and re-reads instead of acting twice. A
step's run row (with its agents' ids) and the frame marked `running` are written in the agent launcher's
transaction, together with the agents' rows and before any agent process starts ("claim, then act"): a
driver that lost the race rolls back its agents with its claim, so only one driver launches them.

Commits per step. A step's outcome and its routing are one transaction; when the routing leads to an agent
step, that step's claim and its agents' rows join it. An agent step therefore costs one commit of taskgate's
own (benchmarks/workflow_overhead.py), plus whatever the agent supervisor records while its agents run.

Where it lives, by concept: this module (the engine, its driver loop and the session effect), the pass
(passes.py: what a pass reads, in one read transaction, and what it does next), starting steps
(steps.py), outcomes and routing (routing.py), the end of a workflow (completion.py),
cut-off steps and restart (interruptions.py), the writes (records.py), hand edits and
approvals (edits.py), the catalogue (catalogue.py), the view (views.py) and what the
engine needs of other services (ports.py).

Restart: `recover` kicks every executing session that has a stack; the driver then collects agents that
ended while nobody watched (AgentService.recover, run first, re-attaches the agents still running and fails
those whose process is gone or never started) and waits out a retry's remaining delay.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from taskgate.application.agents.outputs import OutputService
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.commands import FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath, NoEffects
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workflows.catalogue import CatalogueLookup
from taskgate.application.workflows.completion import Completion
from taskgate.application.workflows.edits import StackEdits
from taskgate.application.workflows.interruptions import Interruptions
from taskgate.application.workflows.passes import DriverPasses, PassReads
from taskgate.application.workflows.ports import (
    SYSTEM_ACTOR,
    StepLauncher,
    VerificationDecider,
    WorkflowOptions,
    WorktreeChanges,
)
from taskgate.application.workflows.routing import Routing
from taskgate.application.workflows.steps import StepStarts
from taskgate.application.workflows.storage import ProjectFiles
from taskgate.application.workflows.views import StackReading
from taskgate.domain.entities import Session, StepRun
from taskgate.domain.errors import ConcurrentModification, ConflictError, InvalidInput, InvalidTransition
from taskgate.domain.states import SessionState
from taskgate.domain.workflows.definitions import Catalogue
from taskgate.domain.workflows.run import Frame

__all__ = ["SYSTEM_ACTOR", "StepLauncher", "VerificationDecider", "WorkflowEngine", "WorkflowOptions",
           "WorktreeChanges"]  # fmt: skip

_log = logging.getLogger(__name__)
_CLOSE_ON = frozenset({SessionState.FAILED, SessionState.CANCELLED, SessionState.TIMED_OUT, SessionState.ABANDONED})


class WorkflowEngine(
    DriverPasses, StepStarts, Routing, Completion, Interruptions, StackEdits, StackReading, CatalogueLookup, NoEffects
):
    """Runs workflow stacks; also a session effect (it drives a session that enters executing)."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        catalogue: Callable[[], Catalogue],
        clock: Clock,
        options: WorkflowOptions | None = None,
        launcher: StepLauncher | None = None,
        files: ProjectFiles | None = None,
    ) -> None:
        self._uow, self._sessions, self._load_catalogue, self._clock = uow, sessions, catalogue, clock
        self._options = options or WorkflowOptions()
        self._launcher = launcher
        self._files = files  # `load:` files and `{config_source}:key` configs of the project
        self._outputs: OutputService | None = None  # `{session-folder}`, and the manifest's inputs
        self._workspaces: WorktreeChanges | None = None  # files changed by nested frames
        self._catalogue: Catalogue | None = None
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._queued: set[str] = set()  # sessions with a driver task that has not taken the lock yet
        self._tasks: dict[str, set[asyncio.Task]] = {}
        # the session as the running driver's last save left it: the driver's next pass starts from it instead
        # of reading it again. Safe because every write is version-checked: a change made meanwhile by anyone
        # else makes the next save fail with ConcurrentModification, after which the driver reads afresh.
        # (a key is present only while its session's drive runs; stack edits outside a drive record nothing)
        self._written: dict[str, Session | None] = {}
        self._reads: dict[str, PassReads] = {}  # what the current pass of each drive read (passes.py)
        self._roots: dict[int, str] = {}  # project id → root path (immutable), for `{project-root}`
        self._decisions: VerificationDecider | None = None

    def use_decisions(self, decisions: VerificationDecider) -> None:
        """Take a workflow's last approval as the verification decision through `decisions` (DecisionService),
        so its guards apply and the decision is recorded (the composition root attaches it)."""
        self._decisions = decisions

    def use_workspaces(self, workspaces: WorktreeChanges) -> None:
        """Attach the worktrees, to tell which files a nested workflow or group changed (`files_changed`)."""
        self._workspaces = workspaces

    def use_outputs(self, outputs: OutputService) -> None:
        """Attach the session folders: `{session-folder}` in prompts, and the manifest's record of their inputs."""
        self._outputs = outputs

    def use_launcher(self, launcher: StepLauncher) -> None:
        """Attach the agents (the composition root does this once: agents and engine need each other)."""
        self._launcher = launcher

    @property
    def options(self) -> WorkflowOptions:
        """The `[workflows]` settings the engine runs with."""
        return self._options

    async def step_runs(self, session_id: str, limit: int = 200) -> list[StepRun]:
        """The session's newest `limit` step runs, oldest first. Raises: SessionNotFound."""
        async with self._uow(write=False) as uow:
            await uow.sessions.get(session_id)
            return await uow.step_runs.of_session(session_id, limit)

    # -- driving ----------------------------------------------------------------------------------------------

    def kick(self, session_id: str) -> None:
        """Drive the session in the background (coalesced: one waiting driver per session is enough)."""
        if session_id in self._queued:
            return
        self._queued.add(session_id)
        self._spawn(session_id, self.drive(session_id, queued=True))

    async def wait(self, session_id: str) -> None:
        """Until the session's driver has nothing left to do in this process (its agents ended, its retry
        delays passed): it ended, or it waits for a person."""
        while True:
            tasks = list(self._tasks.get(session_id, ()))
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
                continue
            if self._launcher is not None:
                await self._launcher.wait(session_id)
            if not self._tasks.get(session_id):
                return

    async def drive(self, session_id: str, *, queued: bool = False) -> None:
        """Move the session's stack on until it must wait, or the session leaves executing."""
        async with self._lock(session_id):
            if queued:
                self._queued.discard(session_id)
            try:
                await self._drive_locked(session_id)
            except Exception:  # a driver runs as a background task: an unexpected error must not vanish with it
                _log.exception("the workflow driver of session %s stopped on an unexpected error", session_id)
                raise

    async def _drive_locked(self, session_id: str) -> None:
        self._written[session_id] = None  # each drive starts from what the database holds
        try:
            for _ in range(100_000):  # every pass moves a frame or returns; this only bounds a bug
                try:
                    if not await self._step_once(session_id):
                        return
                except ConcurrentModification:
                    self._written[session_id] = None
                    continue  # another process moved the session: read it again
                except (InvalidTransition, ConflictError):
                    return
        finally:
            del self._written[session_id]
            self._reads.pop(session_id, None)

    async def agents_ended(self, session_id: str) -> None:
        """AgentService calls this when an agent of a workflow session ended."""
        self.kick(session_id)

    # -- the session effect ---------------------------------------------------------------------------------

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        """Close the open step runs of a session that left executing; drive one that entered it."""
        session = result.session
        if session.state in _CLOSE_ON:
            await self._close_open_runs(session, cmd)
        if session.state == SessionState.EXECUTING and session.workflow_stack:
            # never take the engine's lock here (the driver holds it while it fires): only queue a driver
            self.kick(session.id)
        return NOTHING

    # -- helpers ----------------------------------------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    @staticmethod
    def _top(stack: list[Frame], session_id: str) -> Frame:
        if not stack:
            raise InvalidInput(f"session {session_id} runs no workflow (its stack is empty)")
        return stack[-1]

    def _kick_if_executing(self, session: Session) -> None:
        if session.state == SessionState.EXECUTING:
            self.kick(session.id)

    def _after_delay(self, session_id: str, seconds: float) -> None:
        async def later() -> None:
            await self._clock.sleep(seconds)
            self.kick(session_id)

        self._spawn(session_id, later())

    def _spawn(self, session_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task of the session's (`wait` waits for it)."""
        task = asyncio.create_task(work)
        tasks = self._tasks.setdefault(session_id, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _now(self) -> str:
        return self._clock.now().isoformat()
