"""An agent's life as a process: a supervising task per agent takes a slot, claims the start (fenced: the session
executing, this node holding it), starts the process with its token and MCP endpoint, watches it (heartbeats, timeout,
stop) and records how it ended."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import suppress
from dataclasses import replace
from datetime import datetime
from pathlib import PurePosixPath

from taskgate.application.agents.ports import AgentExit, Watching
from taskgate.application.agents.setups import prepare
from taskgate.application.ports import UnitOfWork
from taskgate.application.sessions.engine import SessionService
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.quota import QUOTA_RETRIED
from taskgate.domain.agents.reports import (
    CUMULATIVE_WHEN_RESUMED,
    AgentReport,
    conversation_of,
    own_share,
    parse_report,
)
from taskgate.domain.agents.setups import inside_sandbox
from taskgate.domain.agents.stalls import ProgressWatch
from taskgate.domain.agents.transcripts import final_message, result_of
from taskgate.domain.agents.usage import Usage
from taskgate.domain.entities import Agent, AgentStatus, Session
from taskgate.domain.errors import HookFailed, InvalidInput, TaskgateError, VcsError, WrongNode
from taskgate.domain.sandbox import MAX_REFUSALS, SandboxPlan
from taskgate.domain.states import SessionState

_log = logging.getLogger(__name__)


def _sandbox_label(confined: dict[str, str]) -> str | None:
    """The agent record's `sandbox`: how its process was confined, in the words of its start event."""
    if not confined:
        return None
    if confined["sandbox"] == "bwrap":
        return f"bwrap; network {confined['network']}"
    return f"off: {confined.get('sandbox_reason', '')}"


class AgentProcesses:
    """Each agent's process: started once its start is claimed, watched (heartbeats, timeout, stop), and how it ended
    recorded, every write fenced."""

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
                    if (failed := self._resume_failed(agent, outcome, stop)) is not None:
                        agent, outcome = await self._run_afresh(agent, kind, stop, failed)
            failed_home = await self._bring_back(agent)  # its commits onto the branch before anyone looks at it
            await self._record_refusals(agent)
            if failed_home and outcome.reason == "exited" and outcome.exit_code == 0:
                agent = replace(agent, error=failed_home)
            await self._after_agent_hook(agent, stop)  # the project's after_agent hook (not blocking)
            self._gone.get(agent.id, asyncio.Event()).set()  # its process is gone: a waiting `stop` may go on
            if stop.is_set() and not (outcome.reason == "exited" and outcome.exit_code == 0):
                # stopped (a cancel, a fail): however the process ended, or failed to start in a worktree the
                # cancel removed meanwhile, the agent was cancelled, not failed
                outcome = replace(outcome, reason="cancelled")
            budget = self._stopped_for_budget(agent)
            if budget is not None:
                agent = replace(agent, error=f"stopped: {budget}")
            quota = await self._quota_line(agent, kind, outcome, stop)  # a 429: waits and runs again (quotas.py)
            if quota is not None:
                agent = replace(agent, error=f"{QUOTA_RETRIED}after a wait: {quota}")
                outcome = replace(outcome, reason="cancelled")
            await self._finish(agent, outcome, notify=quota is None)
            if budget is not None:
                await self._suspend_for_budget(agent.session_id, budget)
            if quota is not None:
                await self._relaunch_after_quota(agent, kind, quota, stop)
        except _NotStarted as exc:  # the session moved on (or the agent was stopped) before its process started
            if not exc.ended:
                await self._finish(agent, AgentExit(None, "cancelled", ""), notify=False, error=str(exc))
        except WrongNode:
            return  # another node holds the session now: this node writes nothing about it (logged by the fence)
        except TaskgateError as exc:  # the database or the engine refused: record it, never lose the agent
            await self._finish(agent, AgentExit(None, "start_failed", ""), notify=True, error=str(exc))
        except Exception as exc:  # a bug or an OS error: still recorded (an agent left `queued` waits forever)
            _log.exception("agent %s: supervision failed", agent.id)
            await self._finish(
                agent, AgentExit(None, "start_failed", ""), notify=True, error=f"internal error: {exc!r}"
            )
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
                                  not in LIVE)  # fmt: skip
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
            await self._before_agent_hook(session, agent, stop)  # the project's before_agent hook: failed, not started
            # what the CLI needs on disk first: Codex's own CODEX_HOME, the worktree folders git must ignore
            home_of = await self._conversation_home(agent) if kind.setup != "none" else None
            env |= prepare(self._runner, kind, folder=folder, agent_id=agent.id, worktree=cwd, home_of=home_of)
            command, plan, confined = await self._confine(session, agent, kind, command, env, url)
            pid = await self._runner.start(command, cwd, env, output, inherit=kind.credentials, sandbox=plan)
            # its own child, not reaped yet: the pid cannot be another process's before this reads its start time
            started = replace(agent, status=AgentStatus.RUNNING, pid=pid, pgid=pid,
                              process_start=self._runner.process_start(pid), started_at=self._clock.now(),
                              sandbox=_sandbox_label(confined))  # fmt: skip
        except (InvalidInput, HookFailed, VcsError) as exc:
            started, confined = replace(agent, error=str(exc)), {}
        change = {"to": started.status.value, "pid": started.pid, "error": started.error} | confined
        saved = await self._save(started, change)
        if saved != SAVED:
            if started.pid:  # adopted elsewhere, or stopped, in the instant since the claim: it must not work on
                stop.set()
                await self._watch(started, kind, stop)
            if saved == ENDED:
                raise _NotStarted("stopped as its process started", ended=True)
            raise WrongNode(agent.session_id, "another node", str(self._options.node_id), "see the log")
        return started

    def _resume_failed(self, agent: Agent, outcome: AgentExit, stop: asyncio.Event) -> str | None:
        """Why continuing its earlier conversation failed, or None: a resumed agent (not stopped) that exited with an
        error before any turn of the model (Claude Code: "No conversation found with session ID"; Codex: "no
        rollout found for thread id") could not open the conversation, e.g. its CLI's home was lost."""
        if not agent.resumed_from or stop.is_set() or outcome.reason != "exited" or outcome.exit_code == 0:
            return None
        kind = self._type_or_default(agent.agent_type)
        report = parse_report(kind.output_format, self._runner.read_log(str(agent.output_path), REPORT_BYTES))
        if report is not None and report.turns > 0:
            return None  # it was in the conversation: the agent's own failure, not the resume's
        said = (report.error if report is not None else None) or outcome.output_tail.strip()[-300:]
        return f"could not continue conversation {agent.resumed_from}: {said or describe_exit(outcome)}"[:2000]

    async def _run_afresh(
        self, agent: Agent, kind: AgentType, stop: asyncio.Event, why: str
    ) -> tuple[Agent, AgentExit]:
        """The same agent queued again as a fresh run (its whole prompt, a new log), started and watched: a resume
        that failed costs one short attempt, never the run. Recorded on its row (`resume_failed`) and in its
        `agent.status` event back to queued."""
        fresh = await self._afresh(agent, kind)
        log = str(PurePosixPath(self._folder_of(agent.session_id), f"{agent.id}.fresh.log"))
        again = replace(agent, command=fresh.command, resumed_from=None, resume_failed=why, pid=None, pgid=None,
                        process_start=None, status=AgentStatus.QUEUED, error=None, output_path=log)  # fmt: skip
        if await self._save(again, {"to": "queued", "resume_failed": why}) != SAVED:
            raise _NotStarted("ended while its resume was replaced by a fresh run", ended=True)
        if self._endpoint is not None and agent.id in self._holding:  # its first start's hold, taken again below
            self._holding.discard(agent.id)
            await self._endpoint.release()
        started = await self._start(again, kind, stop)
        if not started.pid:
            return started, AgentExit(None, "start_failed", started.error or "")
        return started, await self._watch(started, kind, stop)

    async def _confine(
        self, session: Session, agent: Agent, kind: AgentType, command: list[str], env: dict[str, str], url: str
    ) -> tuple[list[str], SandboxPlan | None, dict[str, str]]:
        """The command as it runs in its sandbox, the plan, and what the agent's start event records of it (the
        audit log says for every agent whether it ran confined, and if not, why). Raises: InvalidInput, VcsError."""
        if self._sandboxes is None:
            return command, None, {}
        seen = self._runner.environment(kind.credentials) | env
        plan = await self._sandboxes.prepare(session, agent.id, kind, command, seen, url)
        if plan is None:
            return command, None, {"sandbox": "off", "sandbox_reason": self._sandboxes.state()[1]}
        return inside_sandbox(kind.setup, command), plan, {"sandbox": "bwrap", "network": plan.network_label}

    async def _bring_back(self, agent: Agent) -> str | None:
        """The agent's commits, made in its sandbox's private git dir, onto the session's branch. A failure is the
        agent's error (its work stays in the private git dir; the next agent's start brings it home)."""
        if self._sandboxes is None:
            return None
        try:
            await self._sandboxes.bring_back(await self._sessions.get(agent.session_id))
        except (VcsError, TaskgateError) as exc:
            return f"its commits could not be brought to the session's branch: {exc}"
        return None

    async def _record_refusals(self, agent: Agent) -> None:
        """What its sandbox refused the agent, as `sandbox.refused` events on its session (`sandbox.breach` for a
        change to what no agent can change): at most MAX_REFUSALS, then one event counting the rest."""
        if self._sandboxes is None or not agent.output_path:
            return
        log = self._runner.read_log(agent.output_path, REPORT_BYTES)
        records = await self._sandboxes.refusals(agent.session_id, agent.id, log)
        if not records:
            return
        shown = records[:MAX_REFUSALS]
        with suppress(WrongNode):
            async with self._uow(write=True) as uow:
                await self._sessions.fence(uow, agent.session_id, f"the sandbox refusals of agent {agent.id}")
                for record in shown:
                    kind = "sandbox.breach" if record.get("what") == "breach" else "sandbox.refused"
                    payload = {**record, "agent": agent.id, "type": agent.agent_type}  # the agent as taskgate knows it
                    await uow.events.append(kind, self._clock.now(), payload, agent.session_id)
                if len(records) > len(shown):
                    more = {"agent": agent.id, "what": "more", "count": len(records) - len(shown)}
                    await uow.events.append("sandbox.refused", self._clock.now(), more, agent.session_id)
                await uow.commit()

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
                    live = await uow.agents.heartbeat(agent.id, self._clock.now())
                    await uow.commit()
            except WrongNode:  # another node adopted the session: its worktree is not this agent's any more
                stop.set()
                return
            if not live:  # a stop from another process (or node) recorded its end: its process ends here too
                stop.set()
                return
            try:  # a spend cap reached stops it (application/agents/budgets.py)
                await self._watch_spend(agent, kind, stop)
            except TaskgateError as exc:  # the check is retried at the next beat; the agent is never lost over it
                _log.warning("agent %s: its spend could not be checked: %s", agent.id, exc)

        assert agent.pid is not None and agent.output_path is not None
        loop = asyncio.get_running_loop()
        progress = ProgressWatch(kind.stall_s, kind.stall_patterns, loop.time()) if kind.stall_s > 0 else None
        if progress is not None:
            self._progress[agent.id] = progress
        watching = Watching(
            kind.timeout_s, kind.max_output_bytes, self._options.stop_grace_s, progress,
            heartbeat_file=str(PurePosixPath(self._folder_of(agent.session_id), f"heartbeat-{agent.id}")),
            on_stall=lambda why: self._stalled(agent, kind, why),
        )  # fmt: skip
        try:
            return await self._runner.wait(
                agent.pid, output_path=agent.output_path, watching=watching, stop=stop, beat=beat,
                beat_every_s=self._options.heartbeat_interval_s, started=agent.process_start,
            )  # fmt: skip
        finally:
            self._progress.pop(agent.id, None)

    async def _finish(self, agent: Agent, outcome: AgentExit, *, notify: bool, error: str | None = None) -> None:
        ok = outcome.reason == "exited" and outcome.exit_code == 0
        status = (
            AgentStatus.COMPLETED
            if ok
            else (AgentStatus.CANCELLED if outcome.reason == "cancelled" else AgentStatus.FAILED)
        )
        stalled = self._stalls.pop(agent.id, None) if outcome.reason == "stalled" else None
        reason = error or agent.error or stalled or (None if ok else describe_exit(outcome))
        report, reason = self._reported(agent, outcome, reason)
        report = await self._own_share(agent, report)
        done = replace(agent, status=status, exit_code=outcome.exit_code, output_tail=outcome.output_tail[-4000:],
                       completed_at=self._clock.now(), error=reason, report=report,
                       ended_by=outcome.signal, conversation_id=self._conversation(agent))  # fmt: skip
        # the agent's token dies in the transaction that records its end (durable: see `_save`)
        change = {"to": status.value, "exit_code": outcome.exit_code, "reason": outcome.reason}
        saved = await self._save(done, change | ({"signal": outcome.signal} if outcome.signal else {}))
        if saved == SAVED and notify and status != AgentStatus.CANCELLED:
            await self._after_agent(agent.session_id)

    async def _own_share(self, agent: Agent, report: dict | None) -> dict | None:
        """A resumed run whose CLI reports the whole conversation's usage (Codex): the earlier runs' shares taken off,
        so usage summed over a session counts each token once."""
        kind = self._type_or_default(agent.agent_type)
        parsed = AgentReport.from_dict(report)
        if not agent.resumed_from or kind.output_format not in CUMULATIVE_WHEN_RESUMED or parsed is None:
            return report
        async with self._uow(write=False) as uow:
            agents = await uow.agents.of_session(agent.session_id)
        earlier = [AgentReport.from_dict(a.report) for a in agents
                   if a.id != agent.id and a.conversation_id == agent.resumed_from]  # fmt: skip
        return own_share(parsed, [e for e in earlier if e is not None]).as_dict()

    def _conversation(self, agent: Agent) -> str | None:
        """The id of the CLI's conversation its log names (what a later run may continue), else what is known."""
        if not agent.output_path:
            return agent.conversation_id
        output_format = self._type_or_default(agent.agent_type).output_format
        log = self._runner.read_log(agent.output_path, REPORT_BYTES)
        return conversation_of(output_format, log) or agent.conversation_id

    def _reported(self, agent: Agent, outcome: AgentExit, reason: str | None) -> tuple[dict | None, str | None]:
        """What the agent's CLI said of its run (its JSON events, per the type's `output_format`; for any format
        its result, `transcripts.final_message`), and the reason it failed: a bare "exited with N" gets the CLI's
        own error appended (`exited with 1: API Error: 500 …`)."""
        output_format = self._type_or_default(agent.agent_type).output_format
        if not agent.output_path:
            return agent.report, reason
        log = self._runner.read_log(agent.output_path, REPORT_BYTES)
        report = parse_report(output_format, log)
        said = final_message(output_format, log) if report is None or not report.final_message else ""
        if said:  # a plain-text agent (or aider): its result only, no usage
            report = replace(report, final_message=said) if report is not None else AgentReport(final_message=said)
        if report is None:
            return agent.report, reason
        if report.is_error and report.error and outcome.reason == "exited" and reason == describe_exit(outcome):
            reason = f"{reason}: {report.error}"
        return report.as_dict(), reason

    async def _save(self, agent: Agent, change: dict[str, object]) -> str:
        """Write the agent's row, its token's revocation when it ended, and an `agent.status` event, fenced and only
        while the row has not ended: SAVED; WRONG_NODE (nothing written, logged by the fence) when this node no
        longer holds the session; ENDED (nothing written) when its end is recorded already (a stop from another
        process came first)."""
        try:
            async with self._uow(write=True) as uow:
                await self._sessions.fence(uow, agent.session_id, f"agent {agent.id} {agent.status.value}")
                if not await self._write_agent(uow, agent, change):
                    return ENDED
                await uow.commit()
        except WrongNode:
            return WRONG_NODE
        if self._outputs is not None:  # manifest.json follows the agents
            entry = {"id": agent.id, "name": agent.agent_type, "run": agent.run, "status": agent.status.value,
                     "exit_code": agent.exit_code, "output": agent.output_path, "error": agent.error,
                     "started_at": _iso(agent.started_at), "completed_at": _iso(agent.completed_at),
                     "conversation_id": agent.conversation_id, "resumed_from": agent.resumed_from,
                     "resume_failed": agent.resume_failed}  # fmt: skip
            if agent.status not in LIVE:  # what it ended with, whole, and what it reported it used
                entry |= {"result": result_of(agent), "usage": Usage.of(agent.report).as_dict()}
            with suppress(TaskgateError):  # a manifest that cannot be written never loses the agent's row
                await self._outputs.record_agents(agent.session_id, [entry], status=f"agent {agent.status.value}")
        return SAVED

    async def _write_agent(self, uow: UnitOfWork, agent: Agent, change: dict[str, object]) -> bool:
        if not await uow.agents.update(agent, only_unended=True):  # an ended row stays as its first writer left it
            return False
        if agent.status not in LIVE and await uow.tokens.revoke_for_agent(agent.id, self._clock.now()):
            # ended: its token stops working with the same commit, and the audit log says so
            revoked = {"agent": agent.id, "why": "agent ended"}
            await uow.events.append("token.revoked", self._clock.now(), revoked, agent.session_id)
        payload = {"agent": agent.id, "type": agent.agent_type, **change}
        await uow.events.append("agent.status", self._clock.now(), payload, agent.session_id)
        return True


MCP_URL = "{mcp_url}"  # left in the stored command at queue time, replaced by the endpoint's URL at start


REPORT_BYTES = 512 * 1024  # the end of an agent's log its CLI's report is read from (the result comes last)


LIVE = frozenset({AgentStatus.QUEUED, AgentStatus.RUNNING})
UNENDED = LIVE | {AgentStatus.LOST}  # lost: its node was marked down, and it may run on there (docs/nodes.md)


STOP_WAIT_S = 10.0  # how long `stop` waits for the stopped agents' supervisors beyond the SIGTERM grace

SAVED, WRONG_NODE, ENDED = "saved", "wrong_node", "ended"  # what `_save` did


class _NotStarted(TaskgateError):
    """An agent's start was not claimed: the session left executing, or the agent was stopped, before its process
    started. `ended`: its row says so already (a stop finished it), so nothing is left to record."""

    def __init__(self, message: str, *, ended: bool) -> None:
        super().__init__(message)
        self.ended = ended


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


_DESCRIPTIONS = {
    "timeout": "killed at its timeout",
    "cancelled": "cancelled",
    "output_limit": "killed: output over its limit",
    "stalled": "stalled",
    "start_failed": "could not start",
    "lost": "its process was lost (killed outside taskgate, or the service restarted without it)",
}


def describe_exit(outcome: AgentExit) -> str:
    if outcome.reason == "exited":
        return f"exited with {outcome.exit_code}"
    return _DESCRIPTIONS.get(outcome.reason, outcome.reason)
