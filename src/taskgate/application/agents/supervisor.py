"""Agents launched into session worktrees, supervised, and recovered after a restart.

`execute` moves a session planning → executing and launches its agents: each gets a row (queued), then a
slot (at most `max_per_session` running per session and `max_total` in the whole service: the rest wait,
queued), then a process in the session's worktree with a token scoped to that session. A supervising task
per agent keeps its heartbeat, waits for it (timeout, stall and stop end its process group: stopping.py) and
records how it ended. When every agent of the session's run has ended, `work_complete` fires; a failed agent fails the
session for the operator (or, with `on_failure = "verify"`, it goes to verifying anyway, with the failure
noted). `request_changes` relaunches the agents with the operator's instructions as `{instructions}`; an agent whose
CLI can resume (`AgentType.resume`) continues its earlier run's conversation, told only what changed.

Races: all of a session's agent bookkeeping happens in this process's supervising tasks; the "last agent
ended" check runs under a per-session asyncio lock, and `work_complete` is fired with the version read, so a
session that moved meanwhile (cancelled, failed by the sweeper) is left alone.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from taskgate.application.agents.budgets import AgentBudgets
from taskgate.application.agents.hooks import AgentHooks
from taskgate.application.agents.outputs import OutputService
from taskgate.application.agents.ports import AgentEndpoint, AgentRunner, RunHooks, Sandboxes
from taskgate.application.agents.processes import LIVE, AgentProcesses
from taskgate.application.agents.quotas import AgentQuotas
from taskgate.application.agents.runs import CONTINUES, LAUNCH, AgentRuns
from taskgate.application.agents.setups import check_endpoint
from taskgate.application.agents.stopping import AgentStops
from taskgate.application.operators.access import AccessService
from taskgate.application.ports import Clock, IdGenerator, StepClaim, UnitOfWorkFactory
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.quota import superseded
from taskgate.domain.agents.stalls import ProgressWatch
from taskgate.domain.budgets import NO_BUDGETS
from taskgate.domain.entities import Agent, AgentStatus, Project, Session
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import FORGE_ROUNDS, TERMINAL_STATES, SessionState, Trigger

_STOP_ON = frozenset({Trigger.CANCEL, Trigger.FAIL, Trigger.REJECT, Trigger.TIMEOUT, Trigger.ABANDON})


@dataclass(frozen=True, slots=True)
class ExecutionOptions:
    default_agents: tuple[str, ...] = ()
    max_per_session: int = 8
    max_total: int = 16
    on_failure: str = "fail"  # fail | verify
    heartbeat_interval_s: float = 5.0
    mcp_url: str = ""
    config_dir: str = ""  # `{config_dir}` in agent commands: the loaded config's folder (.taskgate/agents/… resolve)
    catalogue_dir: str = ""  # `{catalogue_dir}`: the built-in catalogue (the scripted example agents live there)
    prompt: str = "Work on task {task_id}: {task_title}\n\n{task_description}\n\n{revision}"
    node_id: str | None = (
        None  # this process's node (application/nodes/heartbeats.py), recorded with the agents it launches
    )
    stop_grace_s: float = 2.0  # a stop's SIGTERM, then SIGKILL to what is left after this long


@dataclass(frozen=True, slots=True)
class Launched:
    session: Session
    agents: list[Agent]


class AgentService(AgentRuns, AgentStops, AgentProcesses, AgentHooks, AgentBudgets, AgentQuotas):
    """Launches and supervises agents; also the session effects that stop or relaunch them."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        sessions: SessionService,
        runner: AgentRunner,
        access: AccessService,
        clock: Clock,
        ids: IdGenerator,
        types: Mapping[str, AgentType],
        options: ExecutionOptions,
        outputs_root: str,
        outputs: OutputService | None = None,
    ) -> None:
        self._uow, self._sessions, self._runner, self._access = uow, sessions, runner, access
        self._outputs = outputs
        self._clock, self._ids, self._types, self._options = clock, ids, dict(types), options
        self._outputs_root = outputs_root
        self._global = asyncio.Semaphore(options.max_total)
        self._per_session: dict[str, asyncio.Semaphore] = {}
        self._stops: dict[str, asyncio.Event] = {}  # agent id → set to stop it
        self._gone: dict[str, asyncio.Event] = {}  # agent id → set once its process is gone (or never started)
        self._tasks: dict[str, set[asyncio.Task]] = {}  # session id → supervising tasks
        self._done_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # A session that runs a workflow hands the end of its agents to the workflow engine instead
        self._workflow_listener: Callable[[str], Awaitable[None]] | None = None
        self._endpoint: AgentEndpoint | None = None  # None: agents get `options.mcp_url` as it is
        self._holding: set[str] = set()  # agents that hold the endpoint (released when their supervision ends)
        self._hooks: RunHooks | None = None  # the project's before_agent and after_agent hooks
        self._progress: dict[str, ProgressWatch] = {}  # agent id → its stall watch, while it is watched
        self._stalls: dict[str, str] = {}  # agent id → why it stalled, until its end is recorded
        self._sandboxes: Sandboxes | None = None  # None: agents run unconfined (the fakes of the unit tests)
        self.use_budgets(NO_BUDGETS, {})  # none until the composition root gives them (`use_budgets`)
        for name in options.default_agents:
            self._type(name)

    # -- use cases -------------------------------------------------------------------------------------------

    def use_endpoint(self, endpoint: AgentEndpoint) -> None:
        """Give agents started from now on this MCP endpoint (acquired per agent, released when it ends)."""
        self._endpoint = endpoint

    def use_sandboxes(self, sandboxes: Sandboxes) -> None:
        """Confine each agent process from now on as `sandboxes` says (docs/agents.md), its commits brought home
        to the session's branch after it ends."""
        self._sandboxes = sandboxes

    def sandbox_state(self) -> tuple[str, str]:
        """("bwrap" | "off" | "unavailable", what or why): what `doctor` and `agents list` show."""
        if self._sandboxes is None:
            return "off", "no sandbox configured"
        return self._sandboxes.state()

    async def sandbox_events(self, session_id: str, limit: int = 200) -> list[dict]:
        """What the sandbox refused the session's agents (`sandbox.refused`, `sandbox.breach`), oldest first."""
        async with self._uow(write=False) as uow:
            return await uow.events.list(session_id, limit, kind="sandbox.")

    def use_hooks(self, hooks: RunHooks) -> None:
        """Run the project's `before_agent` and `after_agent` hooks around each agent's process (docs/worktrees.md)."""
        self._hooks = hooks

    def on_workflow_agents_ended(self, listener: Callable[[str], Awaitable[None]]) -> None:
        """Call `listener(session_id)` instead of concluding when an agent of a workflow session ends."""
        self._workflow_listener = listener

    async def execute(self, session_id: str, actor: str, agents: list[str] | None = None) -> Launched:
        """planning → executing, then launch the agents (default: `execution.default_agents`). A session with
        a workflow on its stack and no agents named only moves on: its workflow launches the agents.

        Raises: InvalidInput (unknown agent type, none configured), InvalidTransition, SessionNotFound.
        """
        if not agents and (await self._sessions.get(session_id)).workflow_stack:
            result = await self._sessions.fire(FireTrigger(session_id, Trigger.PLAN_COMPLETE.value, actor))
            return Launched(result.session, [])
        names = list(agents or self._options.default_agents)
        if not names:
            raise InvalidInput("no agents to launch: pass agent names or set execution.default_agents in config")
        if len(names) > 64:
            raise InvalidInput("at most 64 agents per launch")
        self.check_installed(names)
        # The launch is recorded with plan_complete (one commit), so a crash before the agents' rows exist is
        # carried on at restart (`resume`) instead of leaving the session executing with nothing running.
        launch = {"run": await self._next_run(session_id), "agents": names, "instructions": ""}
        cmd = FireTrigger(session_id, Trigger.PLAN_COMPLETE.value, actor, changes={"state_data": {LAUNCH: launch}})
        result = await self._sessions.fire(cmd)
        crashpoints.reached("execute.plan_complete")
        return Launched(result.session, await self._launch_owed(result.session))

    def check_installed(self, names: Sequence[str]) -> None:
        """Refuse, before anything is written, agent types that are unknown, whose program is not installed, that
        need a credential none of which is set, or whose model endpoint is incomplete (`setups.check_endpoint`).

        Raises: InvalidInput naming the agent type, the program, and where it was looked for.
        """
        for name in dict.fromkeys(names):
            kind = self._type(name)
            program = kind.command[0]
            if "{" not in program and self._runner.locate(program) is None:
                raise InvalidInput(
                    f"agent type '{name}' runs '{program}', which is not installed here (not found on PATH); "
                    f"install it, or fix agents.{name}.command (`taskgate agents list` shows what is found)"
                )
            if kind.needs_one_of and not self._runner.has_credential(kind.needs_one_of, kind.logins):
                login = f" or the CLI's own login (~/{kind.logins[0]})" if kind.logins else ""
                raise InvalidInput(
                    f"agent type '{name}' needs one of {', '.join(kind.needs_one_of)} in taskgate's environment"
                    f"{login}; none is there"
                )
            check_endpoint(self._runner, kind)

    async def started(self, session_id: str) -> None:
        """Until no agent of the session waits queued in this process (each was started, or failed to start)."""
        while any(a.status == AgentStatus.QUEUED and a.id in self._stops for a in await self.agents(session_id)):
            await asyncio.sleep(0.05)

    async def wait(self, session_id: str) -> None:
        """Until every supervising task of the session ended (for the CLI's --wait and tests)."""
        while tasks := list(self._tasks.get(session_id, ())):
            await asyncio.gather(*tasks, return_exceptions=True)

    async def agents(self, session_id: str) -> list[Agent]:
        async with self._uow(write=False) as uow:
            await uow.sessions.get(session_id)
            return await uow.agents.of_session(session_id)

    async def launch_step(
        self,
        session_id: str,
        specs: Sequence[tuple[str, str]],
        *,
        instructions: str,
        timeout_s: float | None,
        claim: StepClaim | None = None,
    ) -> list[Agent]:
        """Launch one agent per (agent type, prompt) for a workflow step; `timeout_s` replaces the types' own.
        `claim` (the engine's step run, given the agents' ids) is written in the same transaction as the
        agents' rows, before any process starts: a step never has agents it does not know of, and claiming
        and launching cost one commit.

        Raises: InvalidInput (an unknown agent type, no worktree), SessionNotFound, and whatever `claim`
        raises (ConcurrentModification), with nothing written."""
        kinds = [self._type(name) for name, _ in specs]
        self.check_installed([name for name, _ in specs])
        if timeout_s is not None:
            kinds = [replace(kind, timeout_s=timeout_s) for kind in kinds]
        session = await self._sessions.get(session_id)
        prompts = [prompt for _, prompt in specs]
        return await self._launch(session, kinds, instructions=instructions, prompts=prompts, claim=claim)

    def process_alive(self, pid: int) -> bool:
        """Whether a process with this pid runs on this host (session adoption asks it of a down node's agents)."""
        return self._runner.alive(pid)

    # -- session effects ---------------------------------------------------------------------------------------

    async def check_new_session(self, project: Project) -> None:
        return None  # agents are checked when they are launched (`check_installed`)

    def wants_before(self, trigger: Trigger) -> bool:
        # resume: the run a budget stopped (only with budgets set: else a resume reads nothing before it)
        return trigger in _RELAUNCH_ON or (trigger == Trigger.RESUME and self._budgets.set)

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        """request_changes and retry record the relaunch they owe (the previous run's agents, with the operator's
        instructions, or for a retry why the session failed) in their own transaction; `after` then launches
        what was recorded. A workflow session's retry is the workflow engine's: it runs the step again. A resume
        relaunches only the run a budget stopped (application/agents/budgets.py)."""
        if cmd.trigger == Trigger.RESUME.value:
            return await self._resume_after_budget(session, cmd)
        previous = await self._previous_run(session.id)
        kinds = [self._type_or_default(a.agent_type) for a in previous]
        if not kinds or (cmd.trigger == Trigger.RETRY.value and session.workflow_stack):
            return cmd
        changes = dict(cmd.changes or {})
        data = dict(changes.get("state_data") or {})
        if cmd.trigger == Trigger.RETRY.value:
            instructions = await self._why_failed(session.id)
        else:
            instructions = str(data.get("instructions") or session.state_data.get("instructions") or "")
        run = await self._next_run(session.id)
        # each agent continues its earlier run's conversation where its CLI can (docs/agents.md, resuming)
        continues = [a.conversation_id if k.can_resume else None for a, k in zip(previous, kinds, strict=True)]
        data[LAUNCH] = {"run": run, "agents": [k.name for k in kinds], "instructions": instructions,
                        CONTINUES: continues}  # fmt: skip
        return replace(cmd, changes={**changes, "state_data": data})

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        trigger = Trigger(cmd.trigger)
        if trigger in _STOP_ON or result.session.state in {SessionState.CANCELLED, SessionState.FAILED}:
            await self.stop(result.session.id)
        elif trigger in _RELAUNCH_ON:
            crashpoints.reached("decide.request_changes" if trigger == Trigger.REQUEST_CHANGES else "retry.recorded")
            await self._launch_owed(result.session)
        elif trigger == Trigger.RESUME and result.session.state == SessionState.EXECUTING:
            await self._launch_owed(result.session)  # the run a budget stopped, when its resume recorded one
        if result.session.state in TERMINAL_STATES and self._sandboxes is not None:
            await self._sandboxes.discard(result.session.id)  # its agents ended and their work came home
        return NOTHING

    async def resume(self, session: Session) -> Aftermath:
        """An executing session without a workflow whose agents a crash cut off: the recorded launch that has
        no agents yet is launched; a run whose agents all ended is concluded (work_complete, or fail)."""
        if session.state != SessionState.EXECUTING or session.workflow_stack:
            return NOTHING
        if (owed := await self._owed(session)) is not None:
            launched = await self._launch_owed(session, owed)
            return Aftermath(note=f"launched the recorded run of {len(launched)} agent(s)")
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(session.id)
        run = max((a.run for a in agents), default=0)
        current = [a for a in agents if a.run == run]
        if not current or any(a.status in LIVE for a in current):
            return NOTHING  # nothing ran (an older release's execute) or still running: the sweeper watches it
        # the follow-up, not a fire: the engine resumes under the session's lock and fires it itself
        failed = [a for a in current if a.status != AgentStatus.COMPLETED and not superseded(a)]
        if all(superseded(a) for a in current):  # cut off in a quota wait, before its relaunch: not a success
            failed = current
        return Aftermath(self._conclusion(session, failed))

    # -- internals ---------------------------------------------------------------------------------------------

    def _mine(self, agent: Agent) -> bool:
        """Whether this process's node supervises `agent`: launched by it, or by no node (before nodes existed,
        or with no node configured: one machine)."""
        return agent.node_id is None or self._options.node_id is None or agent.node_id == self._options.node_id

    def _folder_of(self, session_id: str) -> str:
        """The session folder's path: where the session folders say (a workflow may have placed it), else the
        default `<outputs root>/<session id>`."""
        if self._outputs is not None:
            return self._outputs.folder(session_id)
        return str(PurePosixPath(self._outputs_root, session_id))

    def _type(self, name: str) -> AgentType:
        if name not in self._types:
            known = ", ".join(sorted(self._types)) or "none configured"
            raise InvalidInput(f"unknown agent type '{name}'; configured: {known} (see [agents.NAME] in config)")
        return self._types[name]

    def _type_or_default(self, name: str) -> AgentType:
        return self._types.get(name) or AgentType(name, ("true",))


_RELAUNCH_ON = frozenset({Trigger.REQUEST_CHANGES, Trigger.RETRY, *FORGE_ROUNDS})  # rounds: the forge's instructions
