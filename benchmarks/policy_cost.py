"""What the policy checks add to a transition (issue 5), require_tests' own command excluded.

One SQLite file built by the real migrations, one real git repository with a session worktree (a branch of
three Conventional-Commits commits off `main`), and two engines over the same database:

- **lean**: `default_policies` (wip_limit, plan_open, task_unblocked, one_active_session_per_task), the set
  before issue 5: nothing applies to `approve`, three policies to `start`;
- **full**: every built-in policy enabled (commit_message_format too), review_approval min 1, and
  require_tests with a test command, each session holding a stored passing run on its head, so the command is
  never run: what is measured is the policy machinery (prepare: one `worktree_state` git read and one
  stored-run lookup; evaluate: approvals, operator and counts inside the transaction).

Timed, alternating lean and full call by call: `approve` (verifying → awaiting_merge; every session points at
the same worktree, so git state is identical for all) and `start` (ready → planning; full adds
operator_capacity: the operator row and a count of their sessions in progress). Prints median and p95 per
engine and the ratio full / lean, plus the prepare phase alone.

Run:  .venv/bin/python benchmarks/policy_cost.py [--n 200] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.application.sessions.policy_book import PolicyBook, ProjectPolicies
from taskgate.bootstrap import build_services
from taskgate.domain.entities import Operator, Outcome, Session, Task, TaskStatus, TransitionRecord
from taskgate.domain.policies.book import ENABLED_BY_DEFAULT, default_policies
from taskgate.domain.policies.facts import TestRun
from taskgate.domain.session_fsm import find_transition
from taskgate.domain.states import SessionState, Trigger
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator

ACTOR = "operator:alice"
COMMAND = (sys.executable, "-c", "raise SystemExit('require_tests must not run in this benchmark')")
IDENTITY = ("-c", "user.name=bench", "-c", "user.email=bench@example.invalid")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *IDENTITY, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(root: Path) -> tuple[Path, Path, str, str]:
    """A repository on `main` and a session worktree whose branch has three conventional commits."""
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("bench\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "chore: init")
    branch, worktree = "feature/BENCH-0/0000abcd", repo / ".worktrees" / "bench"
    git(repo, "worktree", "add", "-q", "-b", branch, str(worktree), "main")
    for i in range(3):
        (worktree / f"m{i}.py").write_text(f"x = {i}\n")
        git(worktree, "add", f"m{i}.py")
        git(worktree, "commit", "-q", "-m", f"feat(m{i}): add module {i}")
    return repo, worktree, branch, git(worktree, "rev-parse", "HEAD").strip()


def full_book(project: str) -> PolicyBook:
    everything = {name: {"enabled": True} for name in ENABLED_BY_DEFAULT | {"commit_message_format"}}
    everything["wip_limit"] = {"enabled": True, "limit": 1000}
    return PolicyBook(everything, {project: ProjectPolicies(COMMAND, 60.0)})


def engine(uow: Callable[..., SqlAlchemyUnitOfWork], policies: Any) -> SessionService:
    sessions, *_ = build_services(uow, clock=SystemClock(), ids=UuidGenerator(), vcs=GitPythonVcs(), policies=policies)
    return sessions


async def seed(
    uow: Callable[..., SqlAlchemyUnitOfWork], repo: Path, worktree: Path, branch: str, head: str, n: int
) -> tuple[list[str], list[str]]:
    """n sessions in verifying (with a stored passing test run on the head) and n in ready, 10 per plan."""
    now, verifying, ready = datetime.now(UTC), [], []
    async with uow(write=True) as w:
        project = await w.projects.add("repo", "BENCH", str(repo), now)
        await w.operators.add(Operator("alice", "alice", None, [], [], 100_000, now))
        plan_id = 0
        for number in range(2 * n):
            if number % 10 == 0:
                plan_id = (await w.plans.add(project.id, f"plan-{number}", now)).id
            state = SessionState.VERIFYING if number < n else SessionState.READY
            status = TaskStatus.PENDING_REVIEW if number < n else TaskStatus.OPEN
            task = Task(f"BENCH-{number}", project.id, plan_id, f"task {number}", "", 2, status, now)
            await w.tasks.add(task)
            sid, version = str(uuid.uuid4()), 6 if number < n else 3
            session = Session(
                sid,
                task.id,
                project.id,
                plan_id,
                "alice",
                state,
                version,
                now,
                now,
                state_data={"base_branch": "main"},
                branch_name=branch,
                worktree_path=str(worktree),
            )
            await w.sessions.add(session)
            await w.transitions.append(
                TransitionRecord(
                    None, sid, "create", None, state.value, Outcome.APPLIED, "bench", None, [], version, now
                )
            )
            if number < n:
                await w.test_runs.add(TestRun(sid, version, COMMAND, 0, False, 1000, "ok", head, now))
                verifying.append(sid)
            else:
                ready.append(sid)
        await w.commit()
    return verifying, ready


async def timed(action: Callable[[], Awaitable[Any]]) -> int:
    begin = time.perf_counter_ns()
    await action()
    return time.perf_counter_ns() - begin


def stats(samples: list[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) / 1e6, ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] / 1e6


async def alternate(lean: SessionService, full: SessionService, ids: list[str], trigger: str) -> dict[str, list[int]]:
    """Fire `trigger` on each session, alternating engines and who goes first every pair."""
    samples: dict[str, list[int]] = {"lean": [], "full": []}
    engines = {"lean": lean, "full": full}
    for i in range(0, len(ids) - 1, 2):
        order = ("lean", "full") if i % 4 == 0 else ("full", "lean")
        for name, sid in zip(order, ids[i : i + 2], strict=True):
            samples[name].append(await timed(lambda e=engines[name], s=sid: e.fire(FireTrigger(s, trigger, ACTOR))))
    return samples


async def main(n: int, tmp: str | None) -> None:
    with tempfile.TemporaryDirectory(dir=tmp) as folder:
        root = Path(folder)
        repo, worktree, branch, head = make_repo(root)
        database = Database(f"sqlite:///{root / 'bench.db'}")
        await migrations.upgrade(database)

        def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
            return SqlAlchemyUnitOfWork(database, write=write)

        try:
            verifying, ready = await seed(uow, repo, worktree, branch, head, n + 20)
            lean, full = engine(uow, default_policies(1000)), engine(uow, full_book("repo"))
            await alternate(lean, full, verifying[:20], "approve")  # warm-up
            await alternate(lean, full, ready[:20], "start")
            rows = [
                ("approve", await alternate(lean, full, verifying[20:], "approve")),
                ("start", await alternate(lean, full, ready[20:], "start")),
            ]
            prepare = await prepare_only(full, uow, verifying[20:40])
        finally:
            await database.dispose()
    print(f"policy cost on SQLite (synchronous=FULL), n = {n // 2} per engine and trigger")
    print(f"{'trigger':8} {'lean median/p95':>18} {'full median/p95':>18} {'full - lean':>12} {'ratio':>7}")
    for trigger, samples in rows:
        (lm, lp), (fm, fp) = stats(samples["lean"]), stats(samples["full"])
        print(f"{trigger:8} {lm:8.2f} /{lp:7.2f} ms {fm:8.2f} /{fp:7.2f} ms {fm - lm:9.2f} ms {fm / lm:6.2f}x")
    pm, pp = stats(prepare)
    print(f"prepare phase alone (approve: worktree_state + stored-run lookup): {pm:.2f} / {pp:.2f} ms")


async def prepare_only(full: SessionService, uow: Callable[..., SqlAlchemyUnitOfWork], ids: list[str]) -> list[int]:
    """The slow-facts phase on its own (sessions now in awaiting_merge: the approve row is built by hand)."""
    row = find_transition(SessionState.VERIFYING, Trigger.APPROVE, None)
    assert row is not None
    samples, guards = [], full._guards  # a benchmark may look inside
    for sid in ids:
        async with uow(write=False) as r:
            session = await r.sessions.get(sid)
            project = await r.projects.get(session.project_id)
        samples.append(await timed(lambda s=session, p=project, g=guards: g.prepare(row, s, p, dry_run=True)))
    return samples


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="transitions per trigger (half per engine)")
    parser.add_argument("--tmp", default=None, help="folder for the repository and database (default: system tmp)")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.tmp))
