"""What the workflow runtime tests share: a scripted agent runner, workflow files in a temp config dir, and
an engine wired to a test's services."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from taskgate.application.agents.outputs import OutputService
from taskgate.application.agents.ports import AgentExit, GroupEnded
from taskgate.application.agents.supervisor import AgentService, ExecutionOptions
from taskgate.application.workflows.engine import WorkflowEngine, WorkflowOptions
from taskgate.application.workflows.library import WorkflowService
from taskgate.bootstrap import build_agents, build_workflows
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.workflows.run import LoopLimits
from taskgate.infrastructure.workflow_files import WorkflowFiles
from tests.builders import seed, start


class ScriptedAgentRunner:
    """An AgentRunner without processes. The command's first argument says how the agent ends:
    `ok` exits 0, `fail` exits 1, `flaky` fails its first `flaky_failures` runs then exits 0, `hold` runs until
    `release()` (or a stop). Its output is the rest of the command (the prompt), so tests can read prompts."""

    def __init__(self, flaky_failures: int = 2) -> None:
        self._pids = itertools.count(1000)
        self.commands: dict[int, list[str]] = {}
        self.flaky_failures, self.flaky_runs = flaky_failures, 0
        self.released = asyncio.Event()
        self.ended_pids: set[int] = set()
        self.private_files: dict[str, str] = {}
        self.logs: dict[str, str] = {}  # output path → what the agent "printed" (its prompt), for read_log

    async def start(
        self, command: list[str], cwd: str, env: dict[str, str], output_path: str, inherit=(), sandbox=None
    ) -> int:
        pid = next(self._pids)
        self.commands[pid] = list(command)
        return pid

    async def wait(self, pid: int, *, output_path, watching, stop, beat, beat_every_s, started=None) -> AgentExit:
        command = self.commands[pid]
        output = self.logs[output_path] = " ".join(command[1:])
        try:
            if command[0] == "hold":
                stopped = asyncio.create_task(stop.wait())
                released = asyncio.create_task(self.released.wait())
                await asyncio.wait({stopped, released}, return_when=asyncio.FIRST_COMPLETED)
                for task in (stopped, released):
                    task.cancel()
                if stop.is_set():  # stopped: as a real process group that obeyed SIGTERM
                    return AgentExit(None, "cancelled", output, "SIGTERM")
                return AgentExit(0, "exited", output)
            if command[0] == "fail":
                return AgentExit(1, "exited", output)
            if command[0] == "flaky":
                self.flaky_runs += 1
                return AgentExit(1 if self.flaky_runs <= self.flaky_failures else 0, "exited", output)
            return AgentExit(0, "exited", output)
        finally:
            self.ended_pids.add(pid)

    def alive(self, pid: int) -> bool:
        return pid in self.commands and pid not in self.ended_pids

    def process_start(self, pid: int) -> int | None:
        return pid * 10 if self.alive(pid) else None

    async def end(self, pid: int, started: int | None, grace_s: float) -> GroupEnded:
        if not self.alive(pid) or started != pid * 10:
            return GroupEnded(None, not_ours=self.alive(pid))
        self.ended_pids.add(pid)
        return GroupEnded("SIGTERM")

    def ended(self, output_path: str) -> AgentExit | None:
        return None

    def write_private(self, path: str, text: str) -> None:
        self.private_files[path] = text

    def has_credential(self, variables, logins) -> bool:
        return True

    def environment(self, names) -> dict[str, str]:
        return {}

    def ignore_in_worktree(self, worktree: str, folder: str) -> None:
        self.private_files[f"{worktree}/{folder}/.gitignore"] = "*\n"

    def read_private(self, path: str) -> str | None:
        return None

    def locate(self, program: str) -> str | None:
        return None if program.startswith("missing-") else f"/usr/bin/{program}"

    def read_log(self, output_path: str, max_bytes: int) -> str:
        return self.logs.get(output_path, "")[-max_bytes:]

    def started(self, output_path: str | None) -> bool:
        # no output file to tell by: taken as started, so a queued one is lost at restart
        return True

    def release(self) -> None:
        self.released.set()

    def prompts(self, kind: str | None = None) -> list[str]:
        return [" ".join(c[1:]) for c in self.commands.values() if kind is None or c[0] == kind]


APPROVALS = """
id: approvals
description: plan, approve, build
steps:
  - id: plan
    type: agent
    agent: ok
    prompt: plan it
  - id: approve-plan
    type: approval
    message: Read the plan and approve it.
    on_reject: plan
  - id: build
    type: agent
    agent: ok
    prompt: build it
"""

AGENT_TYPES = {name: AgentType(name, (name, "{prompt}")) for name in ("ok", "fail", "flaky", "hold")}


def write_workflows(config: Path, files: dict[str, str]) -> Path:
    """Write `files` ({"development/x.yaml": text, "checklists/y.yaml": text}) under config/."""
    for name, text in files.items():
        target = (
            config
            / ("checklists" if name.startswith("checklists/") else "workflows")
            / name.removeprefix("checklists/")
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return config


@dataclass
class Rig:
    engine: WorkflowEngine
    agents: AgentService
    runner: ScriptedAgentRunner
    catalogue: WorkflowService
    outputs: OutputService | None = None


def rig(services, tmp_path: Path, files: dict[str, str], *, clock=None, limits: LoopLimits | None = None,
        runner: ScriptedAgentRunner | None = None, default: str | None = None,
        folders: bool = False) -> Rig:  # fmt: skip
    """The engine and agents over `services`, with the workflows `files` in a temp config dir; with `folders`,
    real session folders under tmp_path/out (manifest.json, `{session-folder}`)."""
    from taskgate.infrastructure.session_folder import SessionFolderStore
    from taskgate.infrastructure.system import SystemClock, UuidGenerator

    config = write_workflows(tmp_path / "config", files)
    catalogue = WorkflowService(WorkflowFiles(config), set(AGENT_TYPES))
    problems = catalogue.catalogue().problems
    assert not problems, [str(p) for p in problems]
    clock = clock or SystemClock()
    runner = runner or ScriptedAgentRunner()
    outputs = OutputService(services.uow, SessionFolderStore(tmp_path / "out"), clock) if folders else None
    agents = build_agents(
        services.sessions, services.uow, access=services.access, clock=clock, ids=UuidGenerator(),
        types=AGENT_TYPES, options=ExecutionOptions(heartbeat_interval_s=30), outputs_root=str(tmp_path / "out"),
        runner=runner, outputs=outputs,
    )  # fmt: skip
    engine = build_workflows(
        services.sessions, services.uow, catalogue=catalogue.catalogue, clock=clock, agents=agents,
        decisions=services.decisions, options=WorkflowOptions(default, limits or LoopLimits()),
        review_queue=services.review_queue, outputs=outputs,
    )  # fmt: skip
    return Rig(engine, agents, runner, catalogue, outputs)


async def planning_with(services, git_repo: Path, rig_: Rig, workflow: str, actor: str = "alice"):
    """A session in planning whose stack holds `workflow`."""
    seeded = await seed(services, git_repo, tasks=1)
    session = await start(services, seeded.tasks[0])
    await rig_.engine.add_workflow(session.id, workflow, actor)
    return session


async def run_until_idle(rig_: Rig, session_id: str) -> None:
    await asyncio.wait_for(rig_.engine.wait(session_id), timeout=30)


Awaiting = Callable[[], Awaitable[None]]
