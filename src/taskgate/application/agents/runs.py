"""A session's runs of agents: the launch a transition owes (recorded with it, so a crash is carried on), each agent's
row and command, the run's conclusion once its last agent ended (work_complete, or fail), and recovery of this node's
agents at start."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import PurePosixPath

from taskgate.application.agents.ports import AgentExit
from taskgate.application.agents.processes import LIVE, MCP_URL, describe_exit
from taskgate.application.ports import StepClaim
from taskgate.application.sessions import crashpoints
from taskgate.application.sessions.commands import SYSTEM_ACTOR, FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.agents.kinds import (
    CONVERSATION_ID,
    AgentType,
    as_continuation,
    as_revision,
    render_command,
    resuming,
    why_stopped,
)
from taskgate.domain.agents.quota import superseded
from taskgate.domain.entities import Agent, AgentStatus, Session
from taskgate.domain.errors import ConflictError, InvalidInput, InvalidTransition, TaskgateError
from taskgate.domain.states import SessionState, Trigger


class AgentRuns:
    """A session's runs of agents: launched (fenced, in an executing session), concluded when the last one ends, and
    recovered after a restart."""

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
        if agent.status in (AgentStatus.RUNNING, AgentStatus.LOST) and self._its_process_runs(agent):
            if agent.status == AgentStatus.LOST:  # found again: running, under this node's supervision
                agent = replace(agent, status=AgentStatus.RUNNING, completed_at=None, error=None)
                await self._save(agent, {"to": AgentStatus.RUNNING.value, "pid": agent.pid, "found": True})
            self._supervise(agent, self._type_or_default(agent.agent_type), reattach=True)
            return f"re-attached (pid {agent.pid}){was}"
        # it ended while no service watched it: the commits its sandbox kept come home first (never lost)
        await self._bring_back(agent)
        await self._record_refusals(agent)
        if agent.output_path and (ended := self._runner.ended(agent.output_path)) is not None:
            await self._finish(agent, ended, notify=True)
            return f"ended meanwhile ({describe_exit(ended)}){was}"
        await self._finish(agent, AgentExit(None, "lost", ""), notify=True, error="lost at restart")
        return f"marked failed (process gone){was}"

    def _its_process_runs(self, agent: Agent) -> bool:
        """Its pid is alive and, when its start time was recorded, is still its own process (not a reused pid)."""
        if not agent.pid or not self._runner.alive(agent.pid):
            return False
        return agent.process_start is None or self._runner.process_start(agent.pid) == agent.process_start

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
        continues = launch.get(CONTINUES)  # per agent: the conversation it continues, if its CLI can (`before`)
        return await self._launch(session, kinds, instructions=str(launch["instructions"]), run=int(launch["run"]),
                                  continues=continues if isinstance(continues, list) else None)  # fmt: skip

    async def _launch(
        self,
        session: Session,
        kinds: list[AgentType],
        *,
        instructions: str,
        prompts: Sequence[str] | None = None,
        claim: StepClaim | None = None,
        run: int | None = None,
        continues: Sequence[str | None] | None = None,
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
            earlier = list(continues or ())[: len(kinds)]
            earlier += [None] * (len(kinds) - len(earlier))
            made = [
                await self._new_agent(uow, session, kind, run, instructions, prompt, conversation=conversation)
                for kind, prompt, conversation in zip(kinds, given, earlier, strict=True)
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
        self, uow, session: Session, kind: AgentType, run: int, instructions: str, prompt: str | None = None, *,
        conversation: str | None = None, agent_id: str | None = None,
    ) -> Agent:  # fmt: skip
        """The agent's row, queued, its command rendered. `conversation`: the earlier run's conversation it continues
        when its type can resume (`AgentType.resume`): told only what changed (`as_continuation`), not the task again.
        `agent_id`: an existing agent's (its fresh command after a failed resume)."""
        task = await uow.tasks.get(session.task_id, with_blockers=False)
        project = await uow.projects.get(session.project_id)
        agent_id = agent_id or self._ids.new_session_id()
        folder = self._folder_of(session.id)
        values = {
            "task_id": task.id, "task_title": task.title, "task_description": task.description,
            "instructions": instructions, "revision": as_revision(instructions), "session_id": session.id,
            "worktree": session.worktree_path or "",
            "session_folder": folder, "config_dir": self._options.config_dir, "agent_id": agent_id,
            "catalogue_dir": self._options.catalogue_dir,
            # the repository's git dir (worktrees keep their index and refs under it): a sandboxed CLI must be
            # allowed to write there to commit (Codex: --add-dir)
            "git_dir": str(PurePosixPath(project.root_path, ".git")),
            "mcp_url": MCP_URL,  # known when the agent starts (the endpoint may start with it): filled by `_start`
        }  # fmt: skip
        # a workflow step's prompt (its variables resolved by the engine) replaces the type's prompt template
        values["prompt"] = prompt if prompt is not None else (kind.prompt or self._options.prompt).format_map(values)
        command = kind.command
        resumes = bool(conversation and kind.can_resume and prompt is None)
        if resumes:  # its CLI continues its own conversation: it knows the task, so it is told what changed
            command = tuple(resuming(kind.command, kind.resume))
            values |= {"prompt": as_continuation(instructions), CONVERSATION_ID: str(conversation)}
        return Agent(
            id=agent_id,
            session_id=session.id,
            agent_type=kind.name,
            command=render_command(command, values),
            status=AgentStatus.QUEUED,
            output_path=str(PurePosixPath(folder, f"{agent_id}.log")),
            run=run,
            node_id=self._options.node_id,
            resumed_from=conversation if resumes else None,
        )

    async def _afresh(self, agent: Agent, kind: AgentType) -> Agent:
        """The agent as a fresh run of its type (its whole prompt, no conversation continued): what runs when
        continuing its earlier conversation failed. The instructions are its run's, as recorded on the session."""
        async with self._uow(write=False) as uow:
            session = await uow.sessions.get(agent.session_id)
            launch = session.state_data.get(LAUNCH)
            instructions = str(launch.get("instructions") or "") if isinstance(launch, dict) else ""
            fresh = await self._new_agent(uow, session, kind, agent.run, instructions, agent_id=agent.id)
        return fresh

    async def _conversation_home(self, agent: Agent) -> str:
        """The agent whose private CLI home (Codex's CODEX_HOME) holds the conversation `agent` continues: the first
        of the session that had it (Codex keeps a thread's id when it resumes it), else `agent` itself."""
        if not agent.resumed_from:
            return agent.id
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(agent.session_id)
        began = [a for a in agents if a.conversation_id == agent.resumed_from and a.id != agent.id]
        return min(began, key=lambda a: a.run).id if began else agent.id

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
            if session.state != SessionState.EXECUTING or any(a.status in LIVE for a in current):
                return
            failed = [a for a in current if a.status != AgentStatus.COMPLETED and not superseded(a)]
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

    async def _previous_kinds(self, session_id: str) -> list[AgentType]:
        """The agent types of the session's last run (a relaunch after a budget stop runs them afresh)."""
        return [self._type_or_default(a.agent_type) for a in await self._previous_run(session_id)]

    async def _previous_run(self, session_id: str) -> list[Agent]:
        """The agents of the session's last run."""
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(session_id)
        run = max((a.run for a in agents), default=0)
        return [a for a in agents if a.run == run and not superseded(a)]


LAUNCH = "launch"  # state_data key: the agent run a transition owes ({run, agents, instructions}), see `_owed`
# in a relaunch's LAUNCH: per agent, the conversation of the earlier run's agent it continues (None: afresh)
CONTINUES = "continue"
