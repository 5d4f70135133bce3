"""The operator console in a real browser (Debian's Chromium driven by Playwright) against a real `taskgate serve
--http` on a user's repository set up with `taskgate init`, real git worktrees and the built-in scripted coder, on
SQLite and PostgreSQL (issue 16).

The main path is the operator's: sign in, start a task from the board and watch its card move without reloading,
review the diff, comment on two lines and request changes, see the coder's next commit carry those comments,
approve, merge. Then what must be refused: an operator without the approve permission, a forged POST, an agent's
token, and text meant to run as script. Screenshots of the board, the session page and the review are written to
docs/console/ for the README.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from tests.support.console_site import ConsoleSite
from tests.support.served import db_rows

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "console"
XSS = "<script>alert(1)</script> \x1b[31mred\x1b[0m"
WAIT_MS = 60_000


@pytest.fixture(params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConsoleSite]:
    from tests.e2e.test_crash_points import _pg_database

    databases = _pg_database() if request.param == "postgresql" else iter([None])
    svc = ConsoleSite(tmp_path, next(databases))
    svc.backend = request.param
    svc.seed("Parse totals", XSS)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
        for _ in databases:
            pass


async def signed_in(browser: Browser, site: ConsoleSite, who: str, width: int = 1280) -> Page:
    page = await browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(WAIT_MS)
    await page.goto(site.url + "/")
    await expect(page).to_have_url(re.compile(r"/signin"))
    await page.get_by_label("Operator token").fill(site.tokens[who])
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name=re.compile("^Board"))).to_be_visible()
    return page


async def comment_on(page: Page, button, text: str) -> tuple[str, str]:
    """Comment on the diff line of `button`; returns its file and line."""
    file, line = await button.get_attribute("data-file"), await button.get_attribute("data-line")
    await button.click()
    await page.get_by_label(f"Comment on {file}:{line}").fill(text)
    return file, line


def card(page: Page, column: str, task: str):
    return page.locator(f'[data-column="{column}"] li.card', has_text=task)


async def test_start_review_request_changes_approve_merge(site: ConsoleSite, browser: Browser) -> None:
    page = await signed_in(browser, site, "alice")
    task = "SHOP-1"
    await page.get_by_role("button", name=f"Start {task}").click()  # the coder takes 4 s at least
    await expect(page.get_by_text(f"started {task}")).to_be_visible()
    await expect(card(page, "executing", task)).to_be_visible()
    await page.evaluate("window.__not_reloaded = true")  # gone if the page reloads: the card must move live
    await expect(card(page, "verifying", task)).to_be_visible()
    assert await page.evaluate("window.__not_reloaded === true")
    await expect(page.locator("#col-executing .count")).to_have_text("0")
    if site.backend == "sqlite":
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / "board.png"), full_page=True)

    await card(page, "verifying", task).get_by_role("link").click()
    await expect(page.locator("[data-state]")).to_have_text("verifying")
    await expect(page.get_by_role("heading", name=re.compile("Would approve"))).to_be_visible()
    await expect(page.locator("ul.verdict li", has_text="require_tests")).to_have_count(1)  # once, with its advice
    await expect(page.locator("pre.result")).to_have_count(0)  # a script's result is its whole log: shown once
    if site.backend == "sqlite":
        await page.screenshot(path=str(SHOTS / "session.png"), full_page=True)
    session_url = page.url
    sid = session_url.rsplit("/", 1)[-1]

    await page.get_by_role("link", name="Review the diff").first.click()
    buttons = page.locator("table.diff tr.add button.comment")
    assert await buttons.count() >= 2
    first_file, first_line = await comment_on(page, buttons.nth(0), "name the section Totals")
    second_file, second_line = await comment_on(page, buttons.nth(1), "cover the empty input")
    await expect(page.locator("#comment-count")).to_contain_text("2 line comment(s)")
    if site.backend == "sqlite":
        await page.screenshot(path=str(SHOTS / "review.png"), full_page=True)
    await page.get_by_role("button", name="Request changes").click()

    await expect(page).to_have_url(session_url)
    await expect(page.locator("[data-state]")).to_have_text("verifying")  # the coder ran again, live
    branch = site.git("for-each-ref", "--format=%(refname:short)", "refs/heads/feature/").split()[0]
    assert site.git("log", "-1", "--format=%s", branch).strip() == "fix: address review"
    work = site.git("show", f"{branch}:work/parse-totals.md")
    assert f"{first_file}:{first_line}: name the section Totals" in work
    assert f"{second_file}:{second_line}: cover the empty input" in work

    await page.get_by_label("Reason").fill("the comments are addressed")
    await page.get_by_role("button", name="Approve").click()
    await expect(page.locator("[data-state]")).to_have_text("awaiting_merge")
    await page.get_by_role("button", name="Merge").click()
    await expect(page.locator("[data-state]")).to_have_text("completed")
    assert site.git("log", "-1", "--format=%s", "main").strip() == "fix: address review"
    rows = await db_rows(site, "SELECT decision, operator_id FROM decisions WHERE session_id = {} ORDER BY id", sid)
    assert rows == [("request_changes", "alice"), ("approve", "alice")]
    # the review of the merged session shows what its merge landed (its branch is gone): not a 409
    await page.get_by_role("link", name="Review the diff").first.click()
    await expect(page.locator("table.diff").first).to_contain_text("Totals")
