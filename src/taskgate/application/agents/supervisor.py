"""Agents launched into session worktrees, supervised, and recovered after a restart.

`execute` moves a session planning → executing and launches its agents: each gets a row (queued), then a
slot (at most `max_per_session` running per session and `max_total` in the whole service: the rest wait,
queued), then a process in the session's worktree with a token scoped to that session. A supervising task
per agent keeps its heartbeat, waits for it (timeout and cancel kill its process group) and records how it
ended. When every agent of the session's run has ended, `work_complete` fires; a failed agent fails the
session for the operator (or, with `on_failure = "verify"`, it goes to verifying anyway, with the failure
noted). `request_changes` relaunches the agents with the operator's instructions as `{instructions}`.

Races: all of a session's agent bookkeeping happens in this process's supervising tasks; the "last agent
ended" check runs under a per-session asyncio lock, and `work_complete` is fired with the version read, so a
session that moved meanwhile (cancelled, failed by the sweeper) is left alone.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import PurePosixPath

from taskgate.application.agents.outputs import OutputService
from taskgate.application.agents.ports import AgentEndpoint, AgentExit, AgentRunner
from taskgate.application.operators.access import AccessService
from taskgate.application.ports import Clock, IdGenerator, StepClaim, UnitOfWork, UnitOfWorkFactory
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import FireResult, FireTrigger
from taskgate.application.sessions.effects import NOTHING, Aftermath
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.agents.kinds import AgentType, render_command, why_stopped
from taskgate.domain.agents.reports import parse_report
from taskgate.domain.entities import Agent, AgentStatus, Project, Session
from taskgate.domain.errors import ConflictError, InvalidInput, InvalidTransition, TaskgateError, WrongNode
from taskgate.domain.states import SessionState, Trigger

SYSTEM_ACTOR = "system"
MCP_URL = "{mcp_url}"  # left in the stored command at queue time, replaced by the endpoint's URL at start
LAUNCH = "launch"  # state_data key: the agent run a transition owes ({run, agents, instructions}), see `_owed`
REPORT_BYTES = 512 * 1024  # the end of an agent's log its CLI's report is read from (the result comes last)
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
    prompt: str = "Work on task {task_id}: {task_title}\n\n{task_description}\n\n{instructions}"
    node_id: str | None = (
        None  # this process's node (application/nodes/heartbeats.py), recorded with the agents it launches
    )


@dataclass(frozen=True, slots=True)
class Launched:
    session: Session
    agents: list[Agent]


class AgentService:
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
        for name in options.default_agents:
            self._type(name)

    # -- use cases -------------------------------------------------------------------------------------------

    def use_endpoint(self, endpoint: AgentEndpoint) -> None:
        """Give agents started from now on this MCP endpoint (acquired per agent, released when it ends)."""
        self._endpoint = endpoint

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
        """Refuse, before anything is written, agent types that are unknown, whose program is not installed, or
        that need a credential none of which is set.

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

    async def stop_agents(self, session_id: str, agent_ids: Sequence[str]) -> None:
        """Stop these agents of the session (the others run on)."""
        await self.stop(session_id, only=frozenset(agent_ids))

    async def stop(self, session_id: str, only: frozenset[str] | None = None) -> None:
        """Stop every agent of the session (their process groups are killed; they end as cancelled), and return
        once this process's supervisors of them have ended (bounded), so that what follows a cancel (the worktree's
        removal) never runs under a live agent."""
        async with self._uow(write=False) as uow:
            running = [a for a in await uow.agents.of_session(session_id) if a.status in _LIVE]
        if only is not None:
            running = [a for a in running if a.id in only]
        gone: list[asyncio.Event] = []
        for agent in running:
            if agent.id in self._stops:
                self._stops[agent.id].set()
                gone += [self._gone[agent.id]] if agent.id in self._gone else []
            else:  # queued, or owned by no task of this process: nothing to wait for
                await self._finish(agent, AgentExit(None, "cancelled", ""), notify=False)
        # Until their processes are gone (SIGTERM, its grace, SIGKILL: a few seconds), not until their rows are
        # written: that may wait on this very session's lock, which the caller (a cancel's `after`) holds.
        waits = [asyncio.ensure_future(event.wait()) for event in gone]
        if waits:
            _done, pending = await asyncio.wait(waits, timeout=_STOP_WAIT_S)
            for waiting in pending:
                waiting.cancel()

    def process_alive(self, pid: int) -> bool:
        """Whether a process with this pid runs on this host (session adoption asks it of a down node's agents)."""
        return self._runner.alive(pid)

    async def recover(self) -> list[str]:
        """At start: re-attach to agents still running (their pid is alive), start the ones still queued that
        never started (no pid, no output: the crash came before their process), mark the others failed, and let
        their sessions continue. Only this node's agents (see `_mine`): another node's are left to it. Agents a
        surviving node marked `lost` while this node was down are this node's to settle the same way. Returns what
        it did, one line per agent."""
        report = []
        async with self._uow(write=False) as uow:
            active = await uow.agents.active()
            if self._options.node_id is not None:
                active += await uow.agents.of_node(self._options.node_id, frozenset({AgentStatus.LOST}))
        for agent in active:
            if not self._mine(agent):  # another machine's process: its pid means nothing here
                report.append(f"agent {agent.id} of session {agent.session_id}: left to node {agent.node_id}")
                continue
            report.append(f"agent {agent.id} of session {agent.session_id}: {await self._recover_one(agent)}")
        return report

    async def _recover_one(self, agent: Agent) -> str:
        """Settle one of this node's agents that no supervisor watches; says what it did."""
        was = " (it was lost)" if agent.status == AgentStatus.LOST else ""
        if agent.status == AgentStatus.QUEUED and not agent.pid and not self._runner.started(agent.output_path):
            self._supervise(agent, self._type_or_default(agent.agent_type), reattach=False)
            return "started (it was queued)"
        if agent.status in (AgentStatus.RUNNING, AgentStatus.LOST) and agent.pid and self._runner.alive(agent.pid):
            if agent.status == AgentStatus.LOST:  # found again: running, under this node's supervision
                agent = replace(agent, status=AgentStatus.RUNNING, completed_at=None, error=None)
                await self._save(agent, {"to": AgentStatus.RUNNING.value, "pid": agent.pid, "found": True})
            self._supervise(agent, self._type_or_default(agent.agent_type), reattach=True)
            return f"re-attached (pid {agent.pid}){was}"
        if agent.output_path and (ended := self._runner.ended(agent.output_path)) is not None:
            await self._finish(agent, ended, notify=True)  # it ended while no service watched it
            return f"ended meanwhile ({_describe(ended)}){was}"
        await self._finish(agent, AgentExit(None, "lost", ""), notify=True, error="lost at restart")
        return f"marked failed (process gone){was}"

    # -- session effects ---------------------------------------------------------------------------------------

    async def check_new_session(self, project: Project) -> None:
        return None  # agents are checked when they are launched (`check_installed`)

    def wants_before(self, trigger: Trigger) -> bool:
        return trigger in _RELAUNCH_ON

    async def before(self, session: Session, cmd: FireTrigger) -> FireTrigger:
        """request_changes and retry record the relaunch they owe (the previous run's agents, with the operator's
        instructions, or for a retry why the session failed) in their own transaction; `after` then launches
        what was recorded. A workflow session's retry is the workflow engine's: it runs the step again."""
        kinds = await self._previous_kinds(session.id)
        if not kinds or (cmd.trigger == Trigger.RETRY.value and session.workflow_stack):
            return cmd
        changes = dict(cmd.changes or {})
        data = dict(changes.get("state_data") or {})
        if cmd.trigger == Trigger.RETRY.value:
            instructions = await self._why_failed(session.id)
        else:
            instructions = str(data.get("instructions") or session.state_data.get("instructions") or "")
        run = await self._next_run(session.id)
        data[LAUNCH] = {"run": run, "agents": [k.name for k in kinds], "instructions": instructions}
        return replace(cmd, changes={**changes, "state_data": data})

    async def after(self, result: FireResult, cmd: FireTrigger) -> Aftermath:
        trigger = Trigger(cmd.trigger)
        if trigger in _STOP_ON or result.session.state in {SessionState.CANCELLED, SessionState.FAILED}:
            await self.stop(result.session.id)
        elif trigger in _RELAUNCH_ON:
            crashpoints.reached("decide.request_changes" if trigger == Trigger.REQUEST_CHANGES else "retry.recorded")
            await self._launch_owed(result.session)
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
        if not current or any(a.status in _LIVE for a in current):
            return NOTHING  # nothing ran (an older release's execute) or still running: the sweeper watches it
        # the follow-up, not a fire: the engine resumes under the session's lock and fires it itself
        return Aftermath(self._conclusion(session, [a for a in current if a.status != AgentStatus.COMPLETED]))

    # -- internals ---------------------------------------------------------------------------------------------

    async def _why_failed(self, session_id: str) -> str:
        """What a retry tells the agents: the transition that failed the session, with its reason."""
        async with self._uow(write=False) as uow:
            rows = await uow.transitions.history(session_id, limit=20)
        failed = [r for r in rows if r.to_state == SessionState.FAILED.value and r.outcome.value == "applied"]
        if not failed:
            return ""
        last = failed[-1]
        return why_stopped(last.trigger, last.actor, last.reason)

    async def _next_run(self, session_id: str) -> int:
        async with self._uow(write=False) as uow:
            return await uow.agents.last_run(session_id) + 1

    async def _owed(self, session: Session) -> dict | None:
        """The launch recorded on the session whose agents do not exist yet, if any."""
        launch = session.state_data.get(LAUNCH)
        if not isinstance(launch, dict):
            return None
        return launch if await self._next_run(session.id) <= int(launch["run"]) else None

    async def _launch_owed(self, session: Session, launch: dict | None = None) -> list[Agent]:
        """Launch the run recorded on the session (by execute, request_changes or retry), unless it exists
        already (`launch`: what `_owed` found, if the caller asked it already)."""
        launch = launch or await self._owed(session)
        if launch is None:
            return []
        kinds = [self._type_or_default(name) for name in launch["agents"]]
        return await self._launch(session, kinds, instructions=str(launch["instructions"]), run=int(launch["run"]))

    async def _launch(
        self,
        session: Session,
        kinds: list[AgentType],
        *,
        instructions: str,
        prompts: Sequence[str] | None = None,
        claim: StepClaim | None = None,
        run: int | None = None,
    ) -> list[Agent]:
        if not session.worktree_path:
            raise InvalidInput(f"session {session.id} has no worktree to run agents in")
        if not self._sessions.holds(
            session
        ):  # its worktree is on another node's disk (application/sessions/affinity.py)
            await self._sessions.refuse_unless_held(session.id)
        async with self._uow(write=True) as uow:
            # Under the session's row lock: a cancel (or any move out of executing) either commits before this, and
            # nothing is launched, or after, and its stop finds these agents' rows (see `stop`).
            current = await self._sessions.fence(uow, session.id, f"the launch of {len(kinds)} agent(s)")
            if current.state != SessionState.EXECUTING:
                since = await SessionService.since(uow, current)
                raise ConflictError(f"session {session.id} {since or f'is {current.state.value}'}: no agent was "
                                    f"launched (agents run while a session is executing)")  # fmt: skip
            run = run or await uow.agents.last_run(session.id) + 1
            given = prompts if prompts is not None else [None] * len(kinds)
            made = [
                await self._new_agent(uow, session, kind, run, instructions, prompt)
                for kind, prompt in zip(kinds, given, strict=True)
            ]
            if claim is not None:  # first, so a claim that lost the race rolls back before anything else
                await claim(uow, tuple(a.id for a in made))
            for agent in made:
                await uow.agents.add(agent)
                payload = {"agent": agent.id, "type": agent.agent_type, "to": "queued", "run": run}
                await uow.events.append("agent.status", self._clock.now(), payload, session.id)
            await uow.commit()
        crashpoints.reached("execute.queued")
        for agent, kind in zip(made, kinds, strict=True):
            self._supervise(agent, kind, reattach=False)
        return made

    async def _new_agent(
        self, uow, session: Session, kind: AgentType, run: int, instructions: str, prompt: str | None = None
    ) -> Agent:
        task = await uow.tasks.get(session.task_id, with_blockers=False)
        project = await uow.projects.get(session.project_id)
        agent_id = self._ids.new_session_id()
        folder = self._folder_of(session.id)
        values = {
            "task_id": task.id, "task_title": task.title, "task_description": task.description,
            "instructions": instructions, "session_id": session.id, "worktree": session.worktree_path or "",
            "session_folder": folder, "config_dir": self._options.config_dir, "agent_id": agent_id,
            "catalogue_dir": self._options.catalogue_dir,
            # the repository's git dir (worktrees keep their index and refs under it): a sandboxed CLI must be
            # allowed to write there to commit (Codex: --add-dir)
            "git_dir": str(PurePosixPath(project.root_path, ".git")),
            "mcp_url": MCP_URL,  # known when the agent starts (the endpoint may start with it): filled by `_start`
        }  # fmt: skip
        # a workflow step's prompt (its variables resolved by the engine) replaces the type's prompt template
        values["prompt"] = prompt if prompt is not None else (kind.prompt or self._options.prompt).format_map(values)
        return Agent(
            id=agent_id,
            session_id=session.id,
            agent_type=kind.name,
            command=render_command(kind.command, values),
            status=AgentStatus.QUEUED,
            output_path=str(PurePosixPath(folder, f"{agent_id}.log")),
            run=run,
            node_id=self._options.node_id,
        )

    def _supervise(self, agent: Agent, kind: AgentType, *, reattach: bool) -> None:
        stop = self._stops[agent.id] = asyncio.Event()
        gone = self._gone[agent.id] = asyncio.Event()
        task = asyncio.create_task(self._run(agent, kind, stop, reattach=reattach))
        tasks = self._tasks.setdefault(agent.session_id, set())
        tasks.add(task)

        def done(finished: asyncio.Task) -> None:
            tasks.discard(finished)
            self._stops.pop(agent.id, None)
            self._gone.pop(agent.id, None)
            gone.set()

        task.add_done_callback(done)

    async def _run(self, agent: Agent, kind: AgentType, stop: asyncio.Event, *, reattach: bool) -> None:
        slot = self._per_session.setdefault(agent.session_id, asyncio.Semaphore(self._options.max_per_session))
        try:
            async with slot, self._global:
                if stop.is_set():
                    outcome = AgentExit(None, "cancelled", "")
                else:
                    agent = agent if reattach else await self._start(agent, kind, stop)
                    outcome = (
                        await self._watch(agent, kind, stop)
                        if agent.pid
                        else AgentExit(None, "start_failed", agent.error or "")
                    )
            self._gone.get(agent.id, asyncio.Event()).set()  # its process is gone: a waiting `stop` may go on
            if stop.is_set() and not (outcome.reason == "exited" and outcome.exit_code == 0):
                # stopped (a cancel, a fail): however the process ended, or failed to start in a worktree the
                # cancel removed meanwhile, the agent was cancelled, not failed
                outcome = AgentExit(outcome.exit_code, "cancelled", outcome.output_tail)
            await self._finish(agent, outcome, notify=True)
        except _NotStarted as exc:  # the session moved on (or the agent was stopped) before its process started
            if not exc.ended:
                await self._finish(agent, AgentExit(None, "cancelled", ""), notify=False, error=str(exc))
        except WrongNode:
            return  # another node holds the session now: this node writes nothing about it (logged by the fence)
        except TaskgateError as exc:  # the database or the engine refused: record it, never lose the agent
            await self._finish(agent, AgentExit(None, "start_failed", ""), notify=True, error=str(exc))
        finally:
            if agent.id in self._holding and self._endpoint is not None:  # every way out lets the endpoint go
                self._holding.discard(agent.id)
                await self._endpoint.release()

    async def _start(self, agent: Agent, kind: AgentType, stop: asyncio.Event) -> Agent:
        """Start the agent's process, once its start is claimed: in the transaction that issues its token, this
        node still holds the session (fenced), the session is executing and the agent still queued (a cancel's
        stop may have ended it before this task ran). A stop asked for after the claim is seen by `_watch`, which
        kills the process it finds started. Raises: _NotStarted, WrongNode (nothing written)."""
        session = await self._sessions.get(agent.session_id)

        async def claim(uow: UnitOfWork) -> None:
            current = await self._sessions.fence(uow, agent.session_id, f"the start of agent {agent.id}")
            (row,) = await uow.agents.many([agent.id])
            if row.status != AgentStatus.QUEUED or stop.is_set():
                raise _NotStarted(f"stopped before its process started ({row.status.value})", ended=row.status
                                  not in _LIVE)  # fmt: skip
            if current.state != SessionState.EXECUTING:
                since = await SessionService.since(uow, current)
                raise _NotStarted(f"not started: session {current.id} {since or current.state.value}", ended=False)

        token = await self._access.create_agent_token(session.id, f"agent {agent.id}", agent_id=agent.id, check=claim)
        folder = self._folder_of(session.id)
        url = self._options.mcp_url
        if self._endpoint is not None:
            url = await self._endpoint.acquire()
            self._holding.add(agent.id)
        env = {**kind.env, "TASKGATE_SESSION_ID": session.id, "TASKGATE_TASK_ID": session.task_id,
               "TASKGATE_SESSION_FOLDER": folder, "TASKGATE_MCP_URL": url, "TASKGATE_TOKEN": token.secret,
               "TASKGATE_AGENT_ID": agent.id}  # fmt: skip
        if self._outputs is not None:  # the session folder and its manifest exist before the agent writes there
            await self._outputs.open_folder(session.id)
        try:
            command = [part.replace(MCP_URL, url) for part in agent.command]
            self._wire_mcp(kind, agent, folder, url, token.secret)
            cwd, output = str(session.worktree_path), str(agent.output_path)
            pid = await self._runner.start(command, cwd, env, output, inherit=kind.credentials)
            started = replace(agent, status=AgentStatus.RUNNING, pid=pid, started_at=self._clock.now())
        except InvalidInput as exc:
            started = replace(agent, error=str(exc))
        if not await self._save(started, {"to": started.status.value, "pid": started.pid, "error": started.error}):
            if started.pid:  # adopted elsewhere in the instant since the claim: the process must not work on
                stop.set()
                await self._watch(started, kind, stop)
            raise WrongNode(agent.session_id, "another node", str(self._options.node_id), "see the log")
        return started

    def _wire_mcp(self, kind: AgentType, agent: Agent, folder: str, url: str, token: str) -> None:
        """Claude Code reads its MCP servers from `--mcp-config FILE`: written here, private to the service's user,
        holding this agent's own token (revoked when the agent ends). Codex takes the URL in its command
        (`{mcp_url}`) and the token from TASKGATE_TOKEN; scripts read TASKGATE_MCP_URL/TASKGATE_TOKEN."""
        if kind.mcp != "claude" or not url:
            return
        server = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}
        path = str(PurePosixPath(folder, f"{agent.id}.mcp.json"))
        self._runner.write_private(path, json.dumps({"mcpServers": {"taskgate": server}}, indent=2))

    async def _watch(self, agent: Agent, kind: AgentType, stop: asyncio.Event) -> AgentExit:
        async def beat() -> None:
            try:
                async with self._uow(write=True) as uow:
                    await self._sessions.fence(uow, agent.session_id, f"the heartbeat of agent {agent.id}")
                    await uow.agents.heartbeat(agent.id, self._clock.now())
                    await uow.commit()
            except WrongNode:  # another node adopted the session: its worktree is not this agent's any more
                stop.set()

        assert agent.pid is not None and agent.output_path is not None
        return await self._runner.wait(
            agent.pid, output_path=agent.output_path, timeout_s=kind.timeout_s, max_output_bytes=kind.max_output_bytes,
            stop=stop, beat=beat, beat_every_s=self._options.heartbeat_interval_s,
        )  # fmt: skip

    async def _finish(self, agent: Agent, outcome: AgentExit, *, notify: bool, error: str | None = None) -> None:
        ok = outcome.reason == "exited" and outcome.exit_code == 0
        status = (
            AgentStatus.COMPLETED
            if ok
            else (AgentStatus.CANCELLED if outcome.reason == "cancelled" else AgentStatus.FAILED)
        )
        reason = error or agent.error or (None if ok else _describe(outcome))
        report, reason = self._reported(agent, outcome, reason)
        done = replace(agent, status=status, exit_code=outcome.exit_code, output_tail=outcome.output_tail[-4000:],
                       completed_at=self._clock.now(), error=reason, report=report)  # fmt: skip
        # the agent's token dies in the transaction that records its end (durable: see `_save`)
        saved = await self._save(done, {"to": status.value, "exit_code": outcome.exit_code, "reason": outcome.reason})
        if saved and notify and status != AgentStatus.CANCELLED:
            await self._after_agent(agent.session_id)

    def _reported(self, agent: Agent, outcome: AgentExit, reason: str | None) -> tuple[dict | None, str | None]:
        """What the agent's CLI said of its run (its JSON events, per the type's `output_format`), and the reason
        it failed: a bare "exited with N" gets the CLI's own error appended (`exited with 1: API Error: 500 …`)."""
        output_format = self._type_or_default(agent.agent_type).output_format
        if output_format == "text" or not agent.output_path:
            return agent.report, reason
        report = parse_report(output_format, self._runner.read_log(agent.output_path, REPORT_BYTES))
        if report is None:
            return agent.report, reason
        if report.is_error and report.error and outcome.reason == "exited" and reason == _describe(outcome):
            reason = f"{reason}: {report.error}"
        return report.as_dict(), reason

    async def _after_agent(self, session_id: str) -> None:
        """When the run's last agent ended: work_complete, or fail (or verify anyway) if one failed."""
        lock = self._done_locks.get(session_id)
        if lock is None:
            lock = self._done_locks[session_id] = asyncio.Lock()
        async with lock:
            async with self._uow(write=False) as uow:
                session = await uow.sessions.get(session_id)
                engine_decides = bool(session.workflow_stack) and self._workflow_listener is not None
                agents = [] if engine_decides else await uow.agents.of_session(session_id)
            if engine_decides:  # the workflow engine decides what follows (and reads only its step's agents)
                assert self._workflow_listener is not None
                await self._workflow_listener(session_id)
                return
            run = max((a.run for a in agents), default=0)
            current = [a for a in agents if a.run == run]
            if session.state != SessionState.EXECUTING or any(a.status in _LIVE for a in current):
                return
            failed = [a for a in current if a.status != AgentStatus.COMPLETED]
            crashpoints.reached("agents.ended")
            await self._conclude(session, failed)

    async def _conclude(self, session: Session, failed: list[Agent]) -> None:
        # the session may have moved meanwhile (cancelled, suspended, failed by the sweeper): leave it there
        with suppress(InvalidTransition, TaskgateError):
            await self._sessions.fire(self._conclusion(session, failed))

    def _conclusion(self, session: Session, failed: list[Agent]) -> FireTrigger:
        """work_complete when every agent of the run completed; fail (or verify anyway) when some failed."""
        summary = "; ".join(f"{a.agent_type} {a.id[:8]}: {a.error or a.status.value}" for a in failed)
        if failed and self._options.on_failure == "fail":
            reason = f"agent(s) failed: {summary}"[:2000]
            plan = {"compensation_plan": "manual_review"}
            cmd = FireTrigger(session.id, Trigger.FAIL.value, SYSTEM_ACTOR, reason=reason,
                              expected_version=session.version, changes=plan)  # fmt: skip
        else:
            note = {"state_data": {"agent_failures": summary}} if failed else None
            reason = "all agents completed" if not failed else f"agents ended, some failed: {summary}"[:2000]
            cmd = FireTrigger(session.id, Trigger.WORK_COMPLETE.value, SYSTEM_ACTOR, reason=reason,
                              expected_version=session.version, changes=note)  # fmt: skip
        return cmd

    async def _save(self, agent: Agent, change: dict[str, object]) -> bool:
        """Write the agent's row, its token's revocation when it ended, and an `agent.status` event, fenced: False
        (nothing written, logged by the fence) when this node no longer holds the session."""
        try:
            async with self._uow(write=True) as uow:
                await self._sessions.fence(uow, agent.session_id, f"agent {agent.id} {agent.status.value}")
                await self._write_agent(uow, agent, change)
                await uow.commit()
        except WrongNode:
            return False
        if self._outputs is not None:  # manifest.json follows the agents
            entry = {"id": agent.id, "name": agent.agent_type, "run": agent.run, "status": agent.status.value,
                     "exit_code": agent.exit_code, "output": agent.output_path, "error": agent.error,
                     "started_at": _iso(agent.started_at), "completed_at": _iso(agent.completed_at)}  # fmt: skip
            with suppress(TaskgateError):  # a manifest that cannot be written never loses the agent's row
                await self._outputs.record_agents(agent.session_id, [entry], status=f"agent {agent.status.value}")
        return True

    async def _write_agent(self, uow: UnitOfWork, agent: Agent, change: dict[str, object]) -> None:
        await uow.agents.update(agent)
        if agent.status not in _LIVE and await uow.tokens.revoke_for_agent(agent.id, self._clock.now()):
            # ended: its token stops working with the same commit, and the audit log says so
            revoked = {"agent": agent.id, "why": "agent ended"}
            await uow.events.append("token.revoked", self._clock.now(), revoked, agent.session_id)
        payload = {"agent": agent.id, "type": agent.agent_type, **change}
        await uow.events.append("agent.status", self._clock.now(), payload, agent.session_id)

    async def _previous_kinds(self, session_id: str) -> list[AgentType]:
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(session_id)
        run = max((a.run for a in agents), default=0)
        return [self._type_or_default(a.agent_type) for a in agents if a.run == run]

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


_LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})
_STOP_WAIT_S = 15.0  # how long `stop` waits for the stopped agents' supervisors (a kill takes ~2 s)


class _NotStarted(TaskgateError):
    """An agent's start was not claimed: the session left executing, or the agent was stopped, before its process
    started. `ended`: its row says so already (a stop finished it), so nothing is left to record."""

    def __init__(self, message: str, *, ended: bool) -> None:
        super().__init__(message)
        self.ended = ended


_RELAUNCH_ON = frozenset({Trigger.REQUEST_CHANGES, Trigger.RETRY})


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


_DESCRIPTIONS = {
    "timeout": "killed at its timeout",
    "cancelled": "cancelled",
    "output_limit": "killed: output over its limit",
    "start_failed": "could not start",
    "lost": "its process was lost (killed outside taskgate, or the service restarted without it)",
}


def _describe(outcome: AgentExit) -> str:
    if outcome.reason == "exited":
        return f"exited with {outcome.exit_code}"
    return _DESCRIPTIONS.get(outcome.reason, outcome.reason)
