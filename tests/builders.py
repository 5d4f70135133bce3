"""Seeding helpers shared by tests: a project on a real git repo, an operator, a plan and tasks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from taskgate.application.sessions.commands import FireTrigger, StartTask
from taskgate.application.trackers.builtin import AddTask
from taskgate.domain.entities import Plan, Project, Session, Task

OPERATOR = "alice"
ACTOR = f"operator:{OPERATOR}"


@dataclass
class Seeded:
    project: Project
    plan: Plan
    tasks: list[Task]


async def seed(services, repo: Path, *, tasks: int = 3, blocked_by_first: bool = False) -> Seeded:
    """A project on `repo`, operator alice, plan 'Phase 1' with `tasks` tasks (the last blocked by the first)."""
    project = await services.tracker.init_project(str(repo))
    await services.tracker.ensure_operator(OPERATOR)
    plan = await services.tracker.add_plan(project.id, "Phase 1")
    made = []
    for i in range(tasks):
        blockers = [made[0].id] if blocked_by_first and i == tasks - 1 and made else []
        made.append(
            await services.tracker.add_task(AddTask(project.id, f"task {i}", plan_id=plan.id, blocked_by=blockers))
        )
    return Seeded(project, plan, made)


async def start(services, task: Task) -> Session:
    return (await services.sessions.start_task(StartTask(task.id, ACTOR, OPERATOR))).session


async def fire(services, session: Session, *triggers: str, reason: str | None = None) -> Session:
    for trigger in triggers:
        session = (await services.sessions.fire(FireTrigger(session.id, trigger, ACTOR, reason))).session
    return session


# `merge` runs `cleanup_done` by itself (removing the worktree and branch), so the path ends completed.
HAPPY_PATH = ["plan_complete", "work_complete", "approve", "merge"]
