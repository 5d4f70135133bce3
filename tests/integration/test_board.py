"""The console's board read model (application/board.py) on every backend: columns by state, WIP per plan against
the limit, ready tasks, filters, and the event high-water mark that live pages poll."""

from __future__ import annotations

from taskgate.application.board import BoardFilter, BoardQuery
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
