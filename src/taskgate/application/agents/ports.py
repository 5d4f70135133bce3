"""The agents' ports: their rows, the processes they run as (AgentRunner), the MCP endpoint they call back on, and the
session folders they write to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.stalls import ProgressWatch
from taskgate.domain.entities import (
    Agent,
    AgentStatus,
    Session,
)
from taskgate.domain.outputs import OutputLimits, OutputRecord
from taskgate.domain.sandbox import SandboxPlan


class AgentRepository(Protocol):
    """The agents of sessions (one row per agent process) and their heartbeats."""

    async def add(self, agent: Agent) -> None: ...
    async def of_session(self, session_id: str) -> list[Agent]:
        """The session's agents, by id."""

    async def many(self, agent_ids: Sequence[str]) -> list[Agent]:
        """The agents with these ids, in the order given; ids of no agent are left out."""

    async def last_run(self, session_id: str) -> int:
        """The highest launch number (`Agent.run`) among the session's agents; 0 when it has none."""

    async def heartbeat(self, agent_id: str, at: datetime) -> bool:
        """Record a sign of life; False when no such agent exists or it has ended (completed, failed, cancelled: a
        stop recorded elsewhere, and its supervisor then stops its process). A lost agent has not ended."""

    async def record_signal(self, agent_id: str, signal: str) -> bool:
        """Record the signal a stop ended the agent's process group with, unless one is recorded already (of two
        stoppers the first to record wins); False when nothing was written."""

    async def set_status(self, agent_id: str, status: AgentStatus, at: datetime) -> None:
        """Set the status; a status other than queued/running also sets completed_at to `at`."""

    async def update(self, agent: Agent, *, only_unended: bool = False) -> bool:
        """Write every field of the agent (status, pid, times, exit code, output tail, error); with `only_unended`,
        only while its row has not ended (queued, running, or lost), in one statement: of two processes that end
        the same agent (its supervisor, and a stop from another process) the first to write wins and the other
        writes nothing. Returns whether it wrote."""

    async def active(self) -> list[Agent]:
        """Agents queued or running, of every session (what a restarted service must re-attach or fail)."""

    async def of_node(self, node_id: str, statuses: frozenset[AgentStatus]) -> list[Agent]:
        """The node's agents in these statuses, by session then id."""

    async def stale(self, before: datetime) -> list[Agent]:
        """Running agents whose last sign of life (heartbeat_at, else started_at) is older than `before`, by
        session then id. Agents with neither timestamp are left out: nothing says when they were last alive."""

    async def of_project(self, project_id: int) -> list[tuple[Agent, str]]:
        """Every agent of the project's sessions (ended or not), each with its task id (what budgets count)."""

    async def ended(self, *, project_id: int | None = None, since: datetime | None = None) -> list[tuple[Agent, str]]:
        """Agents that ended (`completed_at` set), each with the task id of its session, by end time then id: of
        the project `project_id` and ended at or after `since`, when given (what `taskgate usage` sums)."""


@dataclass(frozen=True, slots=True)
class AgentExit:
    """How an agent process ended. `exit_code` is None when it was killed or its status is unknown;
    `reason` is exited | timeout | cancelled | output_limit | stalled | start_failed | lost; `signal` is the one
    that ended its process group when it was stopped (SIGTERM, SIGKILL), None when it ended by itself."""

    exit_code: int | None
    reason: str
    output_tail: str
    signal: str | None = None


@dataclass(frozen=True, slots=True)
class GroupEnded:
    """What `AgentRunner.end` did: `signal` ended the group (SIGTERM, SIGKILL; None: it was gone already);
    `not_ours`: the pid now belongs to another process, so nothing was signalled; `left`: pids still there when
    the wait gave up."""

    signal: str | None
    not_ours: bool = False
    left: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Watching:
    """How `AgentRunner.wait` watches one agent: its limits, its stall watch (fed with the output as it comes and
    the heartbeat file's changes; the supervisor feeds it tool calls), and what to call when it stalled (before
    the process group is stopped)."""

    timeout_s: float
    max_output_bytes: int
    grace_s: float = 2.0
    progress: ProgressWatch | None = None
    heartbeat_file: str | None = None
    on_stall: Callable[[str], Awaitable[None]] | None = None


class Sandboxes(Protocol):
    """Each agent process's confinement (infrastructure/sandbox; docs/agents.md)."""

    def state(self) -> tuple[str, str]:
        """("bwrap", what confines agents), ("off", why not) or ("unavailable", why: `[sandbox] mode = "bwrap"`
        asked for it and the host cannot, so no agent starts)."""

    async def prepare(
        self,
        session: Session,
        agent_id: str,
        kind: AgentType,
        command: Sequence[str],
        env: Mapping[str, str],
        mcp_url: str,
    ) -> SandboxPlan | None:
        """The sandbox of one agent about to start, its session's private git dir brought up to date; None when
        agents run unconfined. Raises: InvalidInput (the sandbox is required and unavailable, a bad network entry),
        VcsError."""

    async def bring_back(self, session: Session) -> str | None:
        """After an agent of `session` ended: its private branch's commits onto the session's branch (a
        compare-and-swap). Returns the new commit, or None. Raises: VcsError (the branch is left as it was)."""

    async def refusals(self, session_id: str, agent_id: str, log: str) -> list[dict[str, str]]:
        """What the sandbox refused the agent (each a record: what, target, source, and when if known), read
        after it ended; `log` is the end of its output."""

    async def discard(self, session_id: str) -> None:
        """Remove the session's private git dir, home and temp folders (its worktree is gone)."""


class AgentRunner(Protocol):
    """Starts agent processes (argv lists, never a shell) in their own process group, and watches them."""

    async def start(
        self,
        command: list[str],
        cwd: str,
        env: dict[str, str],
        output_path: str,
        inherit: Sequence[str] = (),
        sandbox: SandboxPlan | None = None,
    ) -> int:
        """Start the agent; its stdout and stderr go to `output_path`. Returns the process (group) id. `env` is
        added to a built environment; of the service's own environment only a few basics and the variables
        named in `inherit` (the agent type's credentials) pass through. With `sandbox`, the process runs confined
        by that plan (its network, mounts and limits).

        Raises: InvalidInput when the program cannot be started (missing, not executable, no cwd).
        """

    def write_private(self, path: str, text: str) -> None:
        """Write a file only the service's user may read (an agent's MCP config, which holds its token)."""

    async def wait(
        self,
        pid: int,
        *,
        output_path: str,
        watching: Watching,
        stop: asyncio.Event,
        beat: Callable[[], Awaitable[None]],
        beat_every_s: float,
        started: int | None = None,
    ) -> AgentExit:
        """Until the agent's process group is gone, calling `beat` every `beat_every_s` while it runs. A timeout,
        `stop` being set, the output growing past `max_output_bytes` or a stall (after `on_stall`) ends the whole
        group (as `end` does); so does the leader's own end (no child outlives it). Works for agents started by an
        earlier process too (re-attach after a restart)."""

    def process_start(self, pid: int) -> int | None:
        """The start time of process `pid` (an opaque number that differs between two processes that had the same
        pid), None when no such process runs."""

    async def end(self, pid: int, started: int | None, grace_s: float) -> GroupEnded:
        """End the process group that `pid` leads, from any process on this host: SIGTERM, SIGKILL after `grace_s`,
        until none of it is left. Nothing is signalled when `pid` now is another process than the one started at
        `started`."""

    def alive(self, pid: int) -> bool: ...
    def ended(self, output_path: str) -> AgentExit | None:
        """How an agent that is gone ended, if its wrapper recorded it (re-attach after a restart)."""

    def started(self, output_path: str | None) -> bool:
        """Whether a process was ever started with this output (a queued agent found at restart that was not
        is started then; one that was, with no pid recorded, is lost)."""

    def ignore_in_worktree(self, worktree: str, folder: str) -> None:
        """Make `folder` at the worktree's top ignored by git from inside it (created if missing, with a `.gitignore`
        of `*`), following no symbolic link; nothing when the worktree is gone or `folder` is not a folder."""

    def environment(self, names: Sequence[str]) -> dict[str, str]:
        """The variables among `names` that are set (non-empty) in the service's environment: what `start` would pass
        of them through `inherit`."""

    def read_private(self, path: str) -> str | None:
        """The text of the file at `path` (`~/` is the service's HOME), or None when it is not there or unreadable
        (a CLI's own login, copied into an agent's private home)."""

    def has_credential(self, variables: Sequence[str], logins: Sequence[str]) -> bool:
        """Whether one of `variables` is set in the service's environment, or one of `logins` (paths under HOME,
        a CLI's own login) exists."""

    def locate(self, program: str) -> str | None:
        """Where `program` (an agent command's first element) would be run from: its path, or None when it is
        not installed (not on PATH, or not an executable file)."""

    def read_log(self, output_path: str, max_bytes: int) -> str:
        """The last `max_bytes` of the agent's log (its stdout and stderr), decoded leniently; "" when there is none."""


class AgentEndpoint(Protocol):
    """Where agents reach taskgate's MCP tools. The supervisor acquires it before an agent starts (the URL goes to
    the agent) and releases it when the agent's supervision ends, so an endpoint that runs only for its agents
    (a loopback listener of a CLI process) lives exactly as long as they do."""

    async def acquire(self) -> str:
        """The endpoint's URL, started first if need be."""
        ...

    async def release(self) -> None:
        """One acquirer is done with it."""
        ...


class SessionFolders(Protocol):
    """The session folders (`<data_dir>/agent-outputs/<session id>/`): files agents save, and `manifest.json`.

    Every write stays inside the session's folder: paths are checked by `domain.outputs.output_path`, and the
    adapter follows no symbolic link. Manifest updates are atomic and serialised per session (also across
    processes). Session ids must be UUIDs (InvalidInput otherwise)."""

    limits: OutputLimits

    def path(self, session_id: str) -> str:
        """The folder's absolute path (it may not exist yet)."""

    async def place(self, session_id: str, relative: str) -> str:
        """Put the folder at `relative` under the root (a workflow's `session_folder`), before it exists; returns
        its path. Raises: InvalidInput (a bad path, no session id in it, the folder exists already)."""

    async def ensure(self, session_id: str) -> str:
        """Create the folder if needed; returns its path. Raises: Forbidden when it is a symlink."""

    async def write_output(
        self, session_id: str, relative: str, data: bytes, *, at: datetime, by: str, task: dict[str, Any]
    ) -> OutputRecord:
        """Write `data` to `relative` (atomically replacing an earlier file) and list it in the manifest (created
        with `task` if missing). Raises: InvalidInput for a bad path or a broken limit; Forbidden for a symlink
        or something that is not a regular file or folder on the way."""

    def has_manifest(self, session_id: str) -> bool:
        """Whether the session's folder has a manifest, from a stat or two on the calling thread: for skipping
        work on the many sessions without a folder. A True answer is no promise; read_manifest decides."""

    async def read_manifest(self, session_id: str) -> dict[str, Any] | None:
        """The manifest, or None when the folder has none (or an unreadable one)."""

    async def update_manifest(
        self, session_id: str, mutate: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Replace the manifest with `mutate(current)` (an empty manifest when there is none); returns it."""


class RunHooks(Protocol):
    """The project's worktree hooks around each agent's process (`[hooks]`, application/workspaces/hooks.py)."""

    async def before_agent(self, session: Session, agent_id: str) -> None:
        """Run before the agent's process starts. Raises: HookFailed (the agent must not be started)."""

    async def after_agent(self, session: Session, agent_id: str) -> str | None:
        """Run once the agent's process ended by itself; its failure is recorded and returned, never raised."""
