"""A write-back Beads refused, as the operator meets it in the console (Chromium, a real `taskgate serve --http`,
issue 17): the session page says the tracker is behind, in bd's words; a developer may retry but not dismiss;
once Beads can take it, Retry writes it and the section is gone."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.test_console_browser import signed_in
from tests.support import bead, install_fake_bd, write_beads_state
from tests.support.console_site import ConsoleSite

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleSite]:
    """An epic from Beads merged by alice while its child is still open: Beads refuses to close it."""
    root = tmp_path_factory.mktemp("console-tracker")
    bd = install_fake_bd(root / "bin")
    svc = ConsoleSite(root, TASKGATE_TRACKER__KIND="beads", TASKGATE_TRACKER__BEADS__COMMAND=json.dumps([str(bd)]))
    write_beads_state(svc.repo, bead("sh-e", "Checkout epic", issue_type="epic"),
                      bead("sh-k", "Card form", deps=[("sh-e", "parent-child")]))  # fmt: skip
    svc.seed()
    sid = json.loads(svc.cli("session", "start", "sh-e", "--json"))["id"]
    for trigger in ("plan_complete", "work_complete", "approve"):
        svc.cli("session", "fire", sid, trigger)
    assert "cannot close epic sh-e" in svc.cli("session", "merge", sid)
    svc.session_id = sid
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


async def test_the_session_page_says_beads_is_behind_and_retry_fixes_it_once_beads_can(
    site: ConsoleSite, browser: Browser
) -> None:
    page = await signed_in(browser, site, "bob")
    await page.goto(f"{site.url}/sessions/{site.session_id}")
    section = page.get_by_role("region", name="Tracker out of sync")
    await expect(section).to_contain_text("sh-e → completed pending after 1 attempt(s)")
    await expect(section).to_contain_text("cannot close epic sh-e: 1 open child issue(s)")
    number = await section.locator("li[data-writeback]").get_attribute("data-writeback")
    await expect(section.get_by_role("button", name=f"Dismiss #{number}")).to_be_disabled()  # bob lacks approve
    await section.get_by_role("button", name=f"Retry #{number}").click()
    await expect(page.get_by_text(f"write-back #{number} failed again")).to_be_visible()

    issues = {i["id"]: i for i in map(json.loads, (site.repo / ".beads" / "issues.jsonl").read_text().splitlines())}
    write_beads_state(site.repo, issues["sh-e"], issues["sh-k"] | {"status": "closed"})  # the child done in Beads
    await page.get_by_role("region", name="Tracker out of sync").get_by_role("button", name=f"Retry #{number}").click()
    await expect(page.get_by_text(f"write-back #{number} written")).to_be_visible()
    await expect(page.get_by_role("region", name="Tracker out of sync")).to_have_count(0)
    closed = json.loads((site.repo / ".beads" / "issues.jsonl").read_text().splitlines()[0])
    assert (closed["id"], closed["status"]) == ("sh-e", "closed")
