"""What the console refuses, in a real browser (Chromium) against a real `taskgate serve --http` (issue 16): an
operator without the approve permission, forged and cross-site POSTs, agents' tokens, script in user text; and that
it is usable with the keyboard alone and at phone width. The audit page filters and exports the log."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.test_console_browser import XSS, card, signed_in
from tests.support.console_site import TASKGATE, ConsoleSite, _free_port
from tests.support.served import db_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleSite]:
    """SHOP-1 started and run to verifying from the CLI by alice; SHOP-2 titled with script and an ANSI escape."""
    svc = ConsoleSite(tmp_path_factory.mktemp("console"))
    svc.seed("Parse totals", XSS)
    sid = json.loads(svc.cli("session", "start", "SHOP-1", "--json"))["id"]
    svc.cli("session", "execute", sid)
    svc.session_id = sid
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


async def decisions(site: ConsoleSite) -> list[tuple]:
    return await db_rows(site, "SELECT decision, operator_id FROM decisions WHERE session_id = {}", site.session_id)


async def test_an_operator_without_approve_sees_the_buttons_disabled_and_a_forged_post_is_refused(
    site: ConsoleSite, browser: Browser
) -> None:
    page = await signed_in(browser, site, "bob")
    await page.goto(f"{site.url}/sessions/{site.session_id}")
    await expect(page.locator("[data-state]")).to_have_text("verifying")
    for name in ("Approve", "Reject"):
        await expect(page.get_by_role("button", name=name, exact=True)).to_be_disabled()
    csrf = await page.locator("form.decide input[name=csrf]").input_value()  # bob's own, valid token
    reply = await page.request.post(f"{site.url}/sessions/{site.session_id}/decide",
                                    form={"csrf": csrf, "decision": "approve", "reason": "forged"},
                                    headers={"origin": site.url})  # fmt: skip
    assert reply.status == 403
    assert "approve" in await reply.text()  # the refusal names the permission missing
    assert await decisions(site) == []
    await page.reload()
    await expect(page.locator("[data-state]")).to_have_text("verifying")


async def test_a_post_without_the_csrf_token_or_from_another_site_is_refused(
    site: ConsoleSite, browser: Browser
) -> None:
    page = await signed_in(browser, site, "alice")  # alice may approve: only the request's origin is wrong
    url = f"{site.url}/sessions/{site.session_id}/decide"
    missing = await page.request.post(url, form={"decision": "approve"}, headers={"origin": site.url})
    csrf = await (await page.goto(f"{site.url}/sessions/{site.session_id}")).text()
    token = re.search(r'name="csrf" value="([^"]+)"', csrf)[1]
    elsewhere = await page.request.post(url, form={"csrf": token, "decision": "approve"},
                                        headers={"origin": "http://evil.example"})  # fmt: skip
    assert (missing.status, elsewhere.status) == (403, 403)
    assert await decisions(site) == []


async def test_an_agent_token_cannot_sign_in(site: ConsoleSite, browser: Browser) -> None:
    page = await browser.new_page()
    await page.goto(f"{site.url}/signin")
    await page.get_by_label("Operator token").fill(site.agent_token(site.session_id))
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("agent tokens cannot sign in")
    assert not [c for c in await page.context.cookies() if c["name"] == "taskgate_console"]
    await page.goto(f"{site.url}/")
    await expect(page).to_have_url(re.compile(r"/signin"))


async def test_script_and_escapes_in_a_title_render_as_text(site: ConsoleSite, browser: Browser) -> None:
    page = await signed_in(browser, site, "alice")
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    item = page.locator("#task-SHOP-2")
    await expect(item.locator(".title")).to_have_text("<script>alert(1)</script> ␛[31mred␛[0m")
    assert await item.locator("script").count() == 0
    await page.reload()
    assert dialogs == []
    cookie = next(c for c in await page.context.cookies() if c["name"] == "taskgate_console")
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
    reply = await page.request.get(f"{site.url}/")
    assert "script-src 'self'" in reply.headers["content-security-policy"]
    assert site.tokens["alice"] not in (site.root / "server.log").read_text()


async def test_keyboard_only_sign_in_and_navigation(site: ConsoleSite, browser: Browser) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await page.goto(f"{site.url}/")
    # the token field has focus on arrival; Chromium applies autofocus at its next rendering step, which can come
    # after `goto` returns on a loaded machine, and keys typed before it would go nowhere: wait for the focus
    await expect(page.get_by_label("Operator token")).to_be_focused()
    await page.keyboard.type(site.tokens["alice"])
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name=re.compile("^Board"))).to_be_visible()
    target = card(page, "verifying", "SHOP-1").get_by_role("link")
    for _ in range(60):  # Tab until the card's link has focus, then follow it with Enter
        await page.keyboard.press("Tab")
        if await target.evaluate("el => el === document.activeElement"):
            break
    else:
        raise AssertionError("the session card cannot be reached with Tab")
    await page.keyboard.press("Enter")
    await expect(page.locator("[data-state]")).to_have_text("verifying")


@pytest.mark.parametrize("width", [390, 1280])
async def test_the_board_and_the_session_page_fit_phone_and_laptop_widths(
    site: ConsoleSite, browser: Browser, width: int
) -> None:
    page = await signed_in(browser, site, "alice", width=width)
    for path in ("/", f"/sessions/{site.session_id}"):
        await page.goto(site.url + path)
        overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow}px wider than a {width}px screen"


async def test_the_audit_page_filters_and_exports(site: ConsoleSite, browser: Browser) -> None:
    page = await signed_in(browser, site, "alice")
    await page.get_by_role("link", name="Audit").click()
    await page.get_by_label("Session").fill(site.session_id[:8])
    await page.get_by_label("Entered state").fill("verifying")
    await page.get_by_role("button", name="Filter").click()
    rows = page.locator("table.timeline tbody tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("work_complete")
    async with page.expect_download() as download:
        await page.get_by_role("link", name="CSV").click()
    text = Path(await (await download.value).path()).read_text()
    exported = list(csv.DictReader(io.StringIO(text)))
    assert [(r["trigger"], r["to_state"], r["session_id"]) for r in exported] == [
        ("work_complete", "verifying", site.session_id)
    ]
    reply = await page.request.get(f"{site.url}/audit.json?session={site.session_id}")
    triggers = [r["trigger"] for r in await reply.json()]
    assert triggers[:2] == ["create", "initialize"] and triggers[-1] == "work_complete"


async def test_taskgate_console_prints_a_one_time_link_that_signs_the_local_operator_in_once(
    site: ConsoleSite, browser: Browser, tmp_path: Path
) -> None:
    port = _free_port()
    log = tmp_path / "console.log"
    with log.open("w") as out:
        process = subprocess.Popen([TASKGATE, "console", "--port", str(port)], cwd=site.repo, env=site.env,
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        link = _wait_for(lambda: re.search(r"sign in once with (\S+)", log.read_text()), log)[1]
        assert site.tokens["alice"] not in log.read_text() and "tg_" not in link
        page = await browser.new_page()
        await page.goto(link)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("heading", name=re.compile("^Board"))).to_be_visible()
        await expect(page.locator(".who strong")).to_have_text("alice")
        again = await browser.new_page()
        await again.goto(link)
        await again.get_by_role("button", name="Sign in").click()
        await expect(again.get_by_role("alert")).to_contain_text("used already or has expired")
    finally:
        process.terminate()
        process.wait(timeout=15)
    tokens = json.loads(site.cli("token", "list", "--json"))
    link_tokens = [t for t in tokens if t["label"] == "taskgate console sign-in link"]
    assert len(link_tokens) == 1 and link_tokens[0]["revoked_at"] is not None  # revoked when the console stopped


def _wait_for(found, log: Path, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if match := found():
            return match
        time.sleep(0.1)
    raise AssertionError(f"not printed in time: {log.read_text()}")
