"""The board's columns a page at a time, as the operator meets them in Chromium against a real `taskgate serve
--http` (issue 43): a column of more than one page shows its first 50 cards, the most recently moved first, with
its whole count; "Show the next 50" shows the rest and stays there while the board follows changes live; a page
that is not a number is refused by name, and one past the column's last (the column shrank under it) shows the
last."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect
from sqlalchemy import insert

from taskgate.infrastructure.db import tables as t
from taskgate.infrastructure.db.engine import Database
from tests.e2e.test_console_browser import signed_in
from tests.support.console_site import ConsoleSite

pytestmark = pytest.mark.slow

EXECUTING = 62  # a page of 50 and one of 12


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleSite]:
    svc = ConsoleSite(tmp_path_factory.mktemp("console-board-pages"))
    svc.seed()
    svc.sessions = asyncio.run(store_sessions(Path(svc.env["TASKGATE_DATA_DIR"]) / "taskgate.db", EXECUTING))
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


async def store_sessions(path: Path, count: int) -> dict[str, str]:
    """`count` executing sessions on tasks of their own (PAGED-0 the first moved, PAGED-{count-1} the last),
    written straight into the database as the benchmark does (the board reads nothing else); task id → session id."""
    start = datetime.now(UTC) - timedelta(hours=2)
    tasks, sessions = [], []
    for n in range(count):
        at = start + timedelta(minutes=n)
        tasks.append({"id": f"PAGED-{n}", "project_id": 1, "plan_id": 1, "title": f"paged task {n}", "description": "",
                      "priority": 2, "status": "open", "created_at": at, "source": "builtin"})  # fmt: skip
        sessions.append({"id": str(uuid.uuid4()), "task_id": f"PAGED-{n}", "project_id": 1, "plan_id": 1,
                         "operator_id": "alice", "state": "executing", "prior_state": None, "state_data": {},
                         "workflow_stack": [], "version": 3, "created_at": at, "updated_at": at})  # fmt: skip
    db = Database(f"sqlite:///{path}")
    try:
        conn = await db.open(write=True)
        try:
            await conn.execute(insert(t.tasks), tasks)
            await conn.execute(insert(t.sessions), sessions)
            await conn.commit()
        finally:
            await conn.close()
    finally:
        await db.dispose()
    return {s["task_id"]: s["id"] for s in sessions}


async def test_show_the_next_50_pages_a_column_and_the_page_follows_changes_live(
    site: ConsoleSite, browser: Browser
) -> None:
    page = await signed_in(browser, site, "alice")
    column = page.locator('[data-column="executing"]')
    await expect(column.get_by_role("heading")).to_have_text(f"Executing {EXECUTING}")
    await expect(column.locator("li.card")).to_have_count(50)
    await expect(column.locator("li.card").first).to_contain_text(f"PAGED-{EXECUTING - 1}")  # the newest first
    await expect(column.get_by_role("navigation")).to_contain_text(f"1–50 of {EXECUTING}")

    await column.get_by_role("link", name="Show the next 50 of Executing").click()
    await expect(page).to_have_url(re.compile(r"column=executing&page=2"))
    column = page.locator('[data-column="executing"]')
    await expect(column.locator("li.card")).to_have_count(EXECUTING - 50)
    await expect(column.locator("li.card").last).to_contain_text("PAGED-0")
    await expect(column.get_by_role("navigation")).to_contain_text(f"51–{EXECUTING} of {EXECUTING}")
    await expect(column.get_by_role("link", name="Show the next 50 of Executing")).to_have_count(0)

    # a transition elsewhere: the live part is fetched again, still at page 2 of the column
    site.cli("session", "fire", site.sessions["PAGED-60"], "suspend")
    await expect(column.get_by_role("heading")).to_have_text(f"Executing {EXECUTING - 1}")
    await expect(column.locator("li.card")).to_have_count(EXECUTING - 51)
    await expect(page.locator('[data-column="stopped"] li.card', has_text="PAGED-60")).to_be_visible()

    await column.get_by_role("link", name="Show the previous 50 of Executing").click()
    await expect(page.locator('[data-column="executing"] li.card')).to_have_count(50)
    await page.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("column=executing&page=two", "page must be a whole number, not 'two'"),
        ("column=executing&page=0", "there is no page 0"),
        ("column=everything&page=1", "the board has no column 'everything'"),
        ("page=2", "a board page needs both `column` and `page`"),
    ],
)
async def test_a_page_that_is_not_a_number_or_before_the_first_is_a_clear_400(
    site: ConsoleSite, browser: Browser, query: str, message: str
) -> None:
    page = await signed_in(browser, site, "alice")
    reply = await page.goto(f"{site.url}/?{query}")
    assert reply is not None and reply.status == 400
    await expect(page.get_by_text(message)).to_be_visible()
    await page.close()


async def test_a_page_past_the_columns_last_shows_the_last(site: ConsoleSite, browser: Browser) -> None:
    # what the live refresh asks for when the column shrank under the page shown (it fetches the same address)
    page = await signed_in(browser, site, "alice")
    reply = await page.goto(f"{site.url}/?column=executing&page=9")
    assert reply is not None and reply.status == 200
    column = page.locator('[data-column="executing"]')
    count = int((await column.get_by_role("heading").inner_text()).split()[-1])  # another test may have moved one
    await expect(column.get_by_role("navigation")).to_contain_text(f"51–{count} of {count}")
    await expect(column.locator("li.card")).to_have_count(count - 50)
    await page.close()
