"""The guided demo: a scratch git repo, a fresh SQLite database, and sessions driven through the engine.

It shows, in order: a plan with a blocked task, the blocked task refused, three sessions started (each in its
own git worktree) and a fourth refused by the WIP limit, one session's agent (the built-in catalogue's scripted
coder, a real process supervised by the `AgentService`) committing in its worktree while `main` moves on and
the session moving to verifying when it ends, the operator's review and checkpoint, that session approved and
merged (rebased onto the moved `main`, fast-forwarded, worktree removed), one rejected and rolled back, the freed
slot taken, the project's context and worktrees, `state_at` replaying the log, and the transition log as a Rich
table.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from rich.panel import Panel
from rich.rule import Rule

from taskgate.application.agents.supervisor import AgentService, ExecutionOptions
from taskgate.application.operators.decisions import Decide
from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.sessions.ports import TransitionQuery
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import BUILTIN_CATALOGUE, App, bootstrap, build_agents, load_settings
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.entities import Session
from taskgate.domain.errors import PolicyViolation
from taskgate.entrypoints.agent_lines import agents_table
from taskgate.entrypoints.render import (
    console,
    context_panel,
    review_table,
    sessions_table,
    tasks_table,
    transitions_table,
    worktrees_table,
)
from taskgate.infrastructure.system import UuidGenerator

OPERATOR = "demo-operator"
ACTOR = f"operator:{OPERATOR}"


def _step(title: str) -> None:
    console.print(Rule(f"[bold cyan]{title}[/bold cyan]", align="left"))


_IDENTITY = ["-c", "user.name=taskgate demo", "-c", "user.email=demo@example.invalid"]


def _commit(cwd: Path, name: str, content: str, message: str) -> str:
    """Commit one file in `cwd` (what an agent, or a colleague on main, would do); returns the short sha."""
    (cwd / name).write_text(content)
    subprocess.run(["git", "add", "--", name], cwd=cwd, check=True, capture_output=True)
    subprocess.run(["git", *_IDENTITY, "commit", "-q", "-m", message], cwd=cwd, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True).stdout


def make_scratch_repo(root: Path) -> Path:
    """A git repository with one commit on `main`, like a user's project."""
    repo = root / "scratch-repo"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("# scratch project for the taskgate demo\n")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "README.md"],
        [
            "-c",
            "user.name=taskgate demo",
            "-c",
            "user.email=demo@example.invalid",
            "commit",
            "-q",
            "-m",
            "initial commit",
        ],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def demo_agents(app: App, config_dir: Path) -> AgentService:
    """The demo's agent supervisor, with one agent type made here: `coder`, the scripted coder (no model).

    `mcp_url` is left empty, so the agent saves its summary straight into its session folder and never reaches
    for a server that the demo does not run. bootstrap's own supervisor (`app.agents`, with the configured agent
    types) stays attached too; the demo never launches through it and never stops a session with running agents.
    """
    assert app.uow is not None and app.clock is not None and app.settings is not None
    command = (
        sys.executable,
        "{config_dir}/agents/scripted_coder.py",
        "{task_title}",
        "--instructions",
        "{instructions}",
    )
    coder = AgentType("coder", command, timeout_s=60)
    options = ExecutionOptions(max_per_session=2, max_total=4, heartbeat_interval_s=1.0, config_dir=str(config_dir))
    return build_agents(
        app.sessions, app.uow, access=app.access, clock=app.clock, ids=UuidGenerator(), types={"coder": coder},
        options=options, outputs_root=str(app.settings.data_dir / "agent-outputs"), outputs=app.outputs,
    )  # fmt: skip


async def _fire_all(app: App, session: Session, triggers: list[str], reason: str | None = None) -> Session:
    for trigger in triggers:
        result = await app.sessions.fire(FireTrigger(session.id, trigger, ACTOR, reason))
        console.print(f"  {trigger:<16} {result.record.from_state} → [green]{result.record.to_state}[/green]")
        for record in result.follow_ups:
            console.print(f"  {record.trigger:<16} {record.from_state} → [green]{record.to_state}[/green] (automatic)")
        for warning in result.warnings:
            console.print(f"  [yellow]warning[/yellow] {warning}")
        session = result.session
    return session


async def _start(app: App, task_id: str) -> Session | None:
    try:
        result = await app.sessions.start_task(StartTask(task_id, ACTOR, OPERATOR))
    except PolicyViolation as exc:
        console.print(f"  [red]refused[/red] {task_id}: {exc}")
        return None
    console.print(f"  started {task_id}: session {result.session.id[:8]} is [green]{result.session.state}[/green]")
    return result.session


async def run_demo(workdir: Path | None = None) -> None:
    """Run the demo end to end; `workdir` defaults to a new temporary directory that is kept for exploring."""
    root = (workdir or Path(tempfile.mkdtemp(prefix="taskgate-demo-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    settings = load_settings(data_dir=root / "data", database_url=None)
    console.print(
        Panel.fit(f"taskgate demo\nworkdir   {root}\ndatabase  {settings.resolved_database_url}", border_style="cyan")
    )
    app = await bootstrap(settings)
    try:
        await _story(app, make_scratch_repo(root), demo_agents(app, BUILTIN_CATALOGUE))
    finally:
        await app.close()
    console.print(
        Panel.fit(
            f"Explore it yourself:\n  export TASKGATE_DATA_DIR={root / 'data'}\n  taskgate session list --all\n"
            "  taskgate audit transitions --outcome blocked\n  taskgate fsm --format mermaid",
            border_style="cyan",
        )
    )


async def _story(app: App, repo: Path, agents: AgentService) -> None:
    _step("1. Register the repository, add a plan and tasks (one blocked by another)")
    project = await app.tracker.init_project(str(repo), "demo")
    await app.tracker.ensure_operator(OPERATOR)
    plan = await app.tracker.add_plan(project.id, "Phase 1")
    titles = ["Implement the API", "Add a CLI", "Write integration tests", "Set up CI"]
    tasks = [
        await app.tracker.add_task(AddTask(project.id, t, plan_id=plan.id, priority=i % 3))
        for i, t in enumerate(titles)
    ]
    docs = await app.tracker.add_task(
        AddTask(project.id, "Document the API", plan_id=plan.id, blocked_by=[tasks[0].id])
    )
    console.print(tasks_table(await app.tracker.list_tasks(project.id)))
    console.print(tasks_table(await app.tracker.ready_tasks(project.id), "Ready tasks (the blocked one is absent)"))

    _step("2. A blocked task is refused, and nothing is written")
    await _start(app, docs.id)

    _step("3. Start sessions: the WIP limit (3 per plan) refuses the fourth")
    sessions = [await _start(app, task.id) for task in tasks]
    happy, doomed, _third, waiting = sessions
    assert happy and doomed and waiting is None

    _step(f"4. Session {happy.id[:8]}: a scripted agent codes in its worktree while main moves on")
    console.print(f"  worktree {happy.worktree_path}\n  branch   {happy.branch_name}", highlight=False)
    worktree = Path(str(happy.worktree_path))
    launched = await agents.execute(happy.id, ACTOR, ["coder"])
    console.print(f"  execute          planning → [green]{launched.session.state}[/green]", highlight=False)
    for agent in launched.agents:
        console.print(
            f"  agent {agent.id[:8]} ({agent.agent_type}) launched: {' '.join(agent.command[1:3])}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    sha = _commit(repo, "CHANGELOG.md", "# Changelog\n", "docs: start a changelog")
    console.print(f"  meanwhile {sha.strip()} 'docs: start a changelog' landed on main", highlight=False)
    await agents.wait(happy.id)
    ran = await agents.agents(happy.id)
    console.print(agents_table(ran, f"Agents of session {happy.id[:8]}"))
    for agent in ran:
        console.print(
            f"  {agent.agent_type} {agent.status.value}, exit {agent.exit_code}; its output:", highlight=False
        )
        for line in agent.output_tail.strip().splitlines():
            console.print(f"    {line}", highlight=False, markup=False, soft_wrap=True)
    record = (await app.sessions.history(happy.id, limit=1))[0]
    console.print(
        f"  {record.trigger:<16} {record.from_state} → [green]{record.to_state}[/green] "
        f"(automatic, by {record.actor}: {record.reason})",
        soft_wrap=True,
    )
    await _fire_all(app, happy, ["suspend", "resume"])
    console.print(review_table(await app.workspaces.review(happy.id)))
    checkpoint = await app.workspaces.checkpoint(happy.id, "API reviewed; CHANGELOG on main is unrelated", ACTOR)
    console.print(f"  review checkpoint {checkpoint.id} stored with the operator's note")

    _step(f"5. Session {happy.id[:8]}: the policies (dry run), the operator's decision, the merge")
    check = await app.sessions.check(happy.id, "approve", actor=ACTOR)
    for result in check.verdict.results:
        mark = "[green]✓[/green]" if result.passed else f"[red]✗[/red] {result.message}"
        console.print(f"  {result.policy:<22} {result.severity:<8} {mark}")
    decided = await app.decisions.decide(Decide(happy.id, OPERATOR, "approve", reason="API reviewed"))
    console.print(f"  decision: {decided.summary()}", highlight=False)
    again = await app.decisions.decide(Decide(happy.id, OPERATOR, "approve", reason="API reviewed"))
    console.print(f"  sent again: {again.summary()}", highlight=False)
    await _fire_all(app, happy, ["merge"])
    log = subprocess.run(["git", "log", "--oneline", "main"], cwd=repo, capture_output=True, text=True).stdout
    console.print("  main is now:\n" + "".join(f"    {line}\n" for line in log.splitlines()), highlight=False)
    console.print(f"  worktree removed: {not worktree.exists()}", highlight=False)

    _step(f"6. Session {doomed.id[:8]}: rejected, rolled back, cleaned up")
    await _fire_all(app, doomed, ["plan_complete", "work_complete"])
    rejected = await app.decisions.decide(
        Decide(doomed.id, OPERATOR, "reject", reason="tests do not cover the edge cases", compensation="auto_revert")
    )
    console.print(f"  decision: {rejected.summary()}", highlight=False)
    for record in rejected.follow_ups:
        console.print(f"  {record.trigger:<16} {record.from_state} → [green]{record.to_state}[/green]")

    _step("7. Slots freed: the fourth task starts now; the docs task is unblocked")
    await _start(app, tasks[3].id)
    console.print(tasks_table(await app.tracker.ready_tasks(project.id), "Ready tasks"))
    console.print(sessions_table(await app.sessions.list_sessions(project.id), "All sessions"))
    console.print(worktrees_table(await app.workspaces.list_worktrees(project.id)))
    console.print(context_panel(await app.context.discover(project.id)))

    _step("8. Replaying the log: what state was the happy session in, back then?")
    history = await app.sessions.history(happy.id)
    midway = history[len(history) // 2]
    console.print(
        f"  at {midway.at.isoformat()} session {happy.id[:8]} was "
        f"[bold]{await app.sessions.state_at(happy.id, midway.at)}[/bold]; now it is "
        f"[bold]{(await app.sessions.get(happy.id)).state}[/bold]"
    )

    _step("9. The transition log (every applied and blocked transition, with guard results)")
    console.print(transitions_table(await app.audit.transitions(TransitionQuery(limit=500))))
