"""The console on a workflow session and at a guard's refusal, in Chromium against a real `taskgate serve --http`
(issue 16): the built-in `bug-fix` workflow runs its agents after a Start on the board, its quality checklist is
ticked in place, its approval step answered in place; a Start the WIP limit refuses says why on the task's card,
which waits in ready with its Start button (the refusal is a blocked row in the log, as over MCP)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.test_console_browser import card, signed_in
from tests.support.console_site import ConsoleSite
from tests.support.served import db_rows

pytestmark = pytest.mark.slow
REQUIRED = ["tests-pass", "lint-clean", "types-check", "no-debug-code", "docs-updated"]


def served(root: Path, **settings: str) -> ConsoleSite:
    site = ConsoleSite(root, **settings)
    site.seed("Parse totals", "Import orders")
    site.start()
    return site


async def test_a_workflow_session_waits_on_its_checklist_and_approval_which_are_answered_in_place(
    tmp_path: Path, browser: Browser
) -> None:
    site = served(tmp_path, TASKGATE_WORKFLOWS__DEFAULT="bug-fix")
    try:
        page = await signed_in(browser, site, "alice")
        await page.get_by_role("button", name="Start SHOP-1").click()
        await card(page, "executing", "SHOP-1").get_by_role("link").click()
        checklist = page.get_by_role("form", name=re.compile("Checklist quality-validation"))
        await expect(checklist).to_be_visible()  # work, then tester and reviewer ran; the checklist waits
        for item in REQUIRED:
            await page.get_by_role("button", name=f"Tick {item}").click()
            await expect(page.get_by_role("button", name=f"Tick {item}")).to_have_count(0)
        await expect(page.get_by_text("Waits for an approval at step approve")).to_be_visible()
        await page.get_by_label("Reason").fill("checked by hand")
        await page.get_by_role("button", name="Approve", exact=True).click()
        # the last approval of the workflow is the verification decision too (one approval, as over MCP)
        await expect(page.locator("[data-state]")).to_have_text("awaiting_merge")
        sid = page.url.rsplit("/", 1)[-1]
        steps = await db_rows(site, "SELECT step_id, status FROM step_runs WHERE session_id = {} ORDER BY id", sid)
        assert [s for s in steps if s[0] in ("quality", "approve")] == [
            ("quality", "succeeded"),
            ("approve", "approved"),
        ]
    finally:
        site.stop()


async def test_a_start_refused_by_the_wip_limit_says_why_on_the_card_and_leaves_the_session_ready(
    tmp_path: Path, browser: Browser
) -> None:
    site = served(tmp_path, TASKGATE_POLICIES__WIP_LIMIT__LIMIT="1")
    try:
        json.loads(site.cli("session", "start", "SHOP-1", "--json"))  # the plan's one slot is taken
        page = await signed_in(browser, site, "alice")
        await page.get_by_role("button", name="Start SHOP-2").click()
        waiting = card(page, "ready", "SHOP-2")  # its session was created, `start` refused: it waits in ready
        refusal = waiting.get_by_role("alert")
        await expect(refusal).to_contain_text("wip_limit")
        await expect(refusal).to_contain_text("1 of 1 sessions in progress")
        await expect(waiting.get_by_role("button", name="Start SHOP-2")).to_be_visible()  # to try again later
        sessions = await db_rows(site, "SELECT state, id FROM sessions WHERE task_id = {}", "SHOP-2")
        assert [state for state, _ in sessions] == ["ready"]
        blocked = await db_rows(site, "SELECT trigger FROM transition_log WHERE session_id = {} AND outcome = "
                                "'blocked'", sessions[0][1])  # fmt: skip
        assert blocked == [("start",)]  # the refusal is in the audit log
    finally:
        site.stop()


async def test_a_merge_that_conflicts_names_the_files_and_changes_nothing(tmp_path: Path, browser: Browser) -> None:
    site = served(tmp_path)
    try:
        sid = json.loads(site.cli("session", "start", "SHOP-1", "--json"))["id"]
        site.cli("session", "execute", sid)  # the coder adds work/parse-totals.md → verifying
        site.cli("session", "decide", sid, "approve", "--reason", "fine")  # → awaiting_merge
        (site.repo / "work").mkdir()
        (site.repo / "work" / "parse-totals.md").write_text("# written on main meanwhile\n")
        site.git("add", "work/parse-totals.md")
        site.git("-c", "user.name=Other", "-c", "user.email=other@example.invalid", "commit", "-qm", "meanwhile")
        main_before = site.git("rev-parse", "main").strip()

        page = await signed_in(browser, site, "alice")
        await page.goto(f"{site.url}/sessions/{sid}")
        await page.get_by_role("button", name="Merge").click()
        await expect(page.locator(".flash .error")).to_contain_text("work/parse-totals.md")
        await expect(page.locator("[data-state]")).to_have_text("awaiting_merge")
        assert site.git("rev-parse", "main").strip() == main_before
    finally:
        site.stop()
