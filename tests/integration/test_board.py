"""The console's board read model (application/board.py) on every backend: columns by state, WIP per plan against
the limit, ready tasks, filters, the columns paged and counted in SQL, and the event high-water mark that live
pages poll."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from taskgate.application.board import PAGE_SIZE, BoardFilter, BoardQuery, ColumnPage
from taskgate.domain.entities import Session, Task, TaskStatus
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState
from taskgate.infrastructure.system import SystemClock
from tests.builders import fire, seed, start


def board_of(services) -> BoardQuery:
    return BoardQuery(services.uow, services.sessions, SystemClock())


def columns(board) -> dict[str, list[str]]:
    return {c.key: [card.task_id for card in c.cards] for c in board.columns if c.cards}


async def test_sessions_sit_in_their_state_column_with_the_wip_count_and_the_ready_tasks(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=4)
    planning = await start(services, seeded.tasks[0])
    verifying = await fire(services, await start(services, seeded.tasks[1]), "plan_complete", "work_complete")
    board = await board_of(services).board(seeded.project.id)

    assert columns(board) == {"planning": [planning.task_id], "verifying": [verifying.task_id]}
    assert [(p.name, p.in_progress, p.limit) for p in board.plans] == [("Phase 1", 2, 3)]
    assert [t.id for t in board.ready_tasks] == [t.id for t in seeded.tasks[2:]]
    assert board.operators == ["alice"]
    card = board.columns[1].cards[0]
    assert (card.title, card.state, card.operator_id, card.plan) == ("task 0", "planning", "alice", "Phase 1")
    assert card.in_state_since >= card.created_at and card.agents_running == 0


async def test_finished_sessions_leave_the_wip_count_and_land_in_done(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=2)
    done = await fire(services, await start(services, seeded.tasks[0]), "cancel")
    board = await board_of(services).board(seeded.project.id)
    assert columns(board) == {"done": [done.task_id]}
    assert board.plans[0].in_progress == 0


async def test_filters_narrow_the_cards_to_a_plan_and_an_operator(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=2)
    await start(services, seeded.tasks[0])
    query = board_of(services)
    assert columns(await query.board(seeded.project.id, BoardFilter(operator_id="bob"))) == {}
    mine = await query.board(seeded.project.id, BoardFilter(plan_id=seeded.plan.id, operator_id="alice"))
    assert columns(mine) == {"planning": [seeded.tasks[0].id]}
    assert (await query.board(seeded.project.id, BoardFilter(plan_id=seeded.plan.id + 1))).ready_tasks == []


async def test_every_transition_moves_the_high_water_mark(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=1)
    query = board_of(services)
    before = await query.high_water()
    session = await start(services, seeded.tasks[0])
    after_start = await query.high_water()
    await fire(services, session, "plan_complete")
    assert before < after_start < await query.high_water()


async def test_the_ready_column_shows_the_hundred_most_urgent_and_says_there_are_more(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=101)
    board = await board_of(services).board(seeded.project.id)
    assert len(board.ready_tasks) == 100 and board.more_ready
    assert [t.id for t in board.ready_tasks] == [t.id for t in seeded.tasks[:100]]
    await start(services, seeded.tasks[0])
    board = await board_of(services).board(seeded.project.id)
    assert len(board.ready_tasks) == 100 and not board.more_ready


async def stored_sessions(services, seeded, spread: dict[SessionState, int], operator: str = "alice") -> list[Session]:
    """Sessions written straight through a unit of work (each on a task of its own), `spread` of them per state;
    each moved a minute after the one before, in the order of `spread`."""
    at, made = datetime(2026, 11, 1, tzinfo=UTC), []
    async with services.uow(write=True) as uow:
        for state, count in spread.items():
            for _ in range(count):
                at += timedelta(minutes=1)
                task = Task(f"PG-{len(made)}-{operator}", seeded.project.id, seeded.plan.id, f"paged {len(made)}", "",
                            2, TaskStatus.OPEN, at)  # fmt: skip
                session = Session(str(uuid.uuid4()), task.id, seeded.project.id, seeded.plan.id, operator, state, 5,
                                  at, at)  # fmt: skip
                await uow.tasks.add(task)
                await uow.sessions.add(session)
                made.append(session)
        await uow.commit()
    return made


async def test_columns_are_counted_and_paged_in_sql_the_most_recently_moved_first(services, git_repo) -> None:
    seeded = await seed(services, git_repo, tasks=0)
    S = SessionState
    made = await stored_sessions(services, seeded, {S.EXECUTING: PAGE_SIZE * 2 + 7, S.FAILED: 3, S.SUSPENDED: 2,
                                                    S.COMPLETED: 1})  # fmt: skip
    executing = [s.id for s in reversed(made[: PAGE_SIZE * 2 + 7])]
    query = board_of(services)

    first = await query.board(seeded.project.id)
    by_key = {c.key: c for c in first.columns}
    assert {k: c.count for k, c in by_key.items() if c.count} == {"executing": 107, "stopped": 5, "done": 1}
    assert [c.session_id for c in by_key["executing"].cards] == executing[:PAGE_SIZE]
    assert (by_key["executing"].page, by_key["executing"].pages, by_key["stopped"].pages) == (1, 3, 1)
    assert [c.state for c in by_key["stopped"].cards] == ["suspended", "suspended", "failed", "failed", "failed"]

    last = await query.board(seeded.project.id, paged=ColumnPage("executing", 3))
    column = next(c for c in last.columns if c.key == "executing")
    assert [c.session_id for c in column.cards] == executing[PAGE_SIZE * 2 :]
    assert (column.page, column.first, column.count) == (3, PAGE_SIZE * 2 + 1, 107)
    assert [c.title for c in column.cards][:1] == ["paged 6"]  # the cards' tasks are read for the page shown
    assert next(c for c in last.columns if c.key == "stopped").page == 1


async def test_the_counts_follow_the_filters_and_the_plans_count_their_sessions_in_progress(services, git_repo):
    seeded = await seed(services, git_repo, tasks=0)
    await services.tracker.ensure_operator("bob")
    await stored_sessions(services, seeded, {SessionState.EXECUTING: 4, SessionState.READY: 2})
    await stored_sessions(services, seeded, {SessionState.VERIFYING: 3}, operator="bob")
    query = board_of(services)

    everyone = await query.board(seeded.project.id)
    bobs = await query.board(seeded.project.id, BoardFilter(operator_id="bob"))
    elsewhere = await query.board(seeded.project.id, BoardFilter(plan_id=seeded.plan.id + 1))
    assert {c.key: c.count for c in everyone.columns if c.count} == {"ready": 2, "executing": 4, "verifying": 3}
    assert {c.key: c.count for c in bobs.columns if c.count} == {"verifying": 3}
    assert [c.count for c in elsewhere.columns] == [0] * len(elsewhere.columns)
    assert everyone.operators == bobs.operators == ["alice", "bob"]
    assert [(p.name, p.in_progress) for p in everyone.plans] == [("Phase 1", 7)]  # ready is not in progress


@pytest.mark.parametrize(
    ("paged", "message"),
    [
        (ColumnPage("executing", 0), "has 1 page(s) of 50 cards: there is no page 0"),
        (ColumnPage("nowhere", 1), "the board has no column 'nowhere'"),
    ],
)
async def test_a_page_before_the_first_or_of_no_column_is_refused_by_name(services, git_repo, paged, message) -> None:
    seeded = await seed(services, git_repo, tasks=0)
    await stored_sessions(services, seeded, {SessionState.EXECUTING: 3})
    with pytest.raises(InvalidInput, match=re.escape(message)):
        await board_of(services).board(seeded.project.id, paged=paged)


async def test_a_page_past_a_columns_last_shows_its_last(services, git_repo) -> None:
    # a column shrinks under the page an operator watches: the live refresh asks for the same page again
    seeded = await seed(services, git_repo, tasks=0)
    await stored_sessions(services, seeded, {SessionState.EXECUTING: 53})

    async def executing(page: int):
        board = await board_of(services).board(seeded.project.id, paged=ColumnPage("executing", page))
        return next(c for c in board.columns if c.key == "executing")

    second, past = await executing(2), await executing(7)
    assert (second.page, len(second.cards), second.count) == (2, 3, 53)
    assert past.page == 2 and [c.session_id for c in past.cards] == [c.session_id for c in second.cards]
