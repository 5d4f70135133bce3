"""The REAL Claude Code's permission prompt and question, answered in the console (Chromium, a real
`taskgate serve --http`): the agent runs under `taskgate session execute` in another process, so the answer crosses
from the console's process to the one serving the agent's MCP call through the database."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from tests.e2e.test_console_browser import signed_in
from tests.e2e.test_init import TASKGATE
from tests.e2e.test_operator_questions import tool_results
from tests.support.agent_clis import require_cli, user_variables
from tests.support.console_site import ConsoleSite
from tests.support.model_server import ModelServer

pytestmark = pytest.mark.slow


async def waiting_region(page: Page, url: str, text: str):
    """The session page's "Waiting for you" region once it shows `text` (reloaded until it does)."""
    for _ in range(120):
        await page.goto(url)
        region = page.get_by_role("region", name="Waiting for you")
        if await region.count() and text in (await region.inner_text()):
            return region
        await page.wait_for_timeout(500)
    raise AssertionError(f"no question {text!r} on {url}")


async def test_the_operator_answers_a_permission_prompt_and_a_question_in_the_console(tmp_path: Path, browser: Browser):
    with ModelServer("ask") as model:
        site = ConsoleSite(tmp_path)
        home = tmp_path / "home"
        home.mkdir()
        site.env |= {"HOME": str(home), "PATH": f"{require_cli('claude').parent}:{site.env['PATH']}"}
        site.env |= user_variables("claude", model.url)
        site.seed("Pick a colour")
        sid = json.loads(site.cli("session", "start", "SHOP-1", "--json"))["id"]
        site.start()
        argv = [TASKGATE, "session", "execute", sid, "--agent", "claude"]
        launcher = subprocess.Popen(argv, cwd=site.repo, env=site.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip
        try:
            page = await signed_in(browser, site, "alice")
            for _ in range(120):  # the board's card says an agent waits on the operator
                await page.goto(site.url + "/")
                if await page.locator(f'li[data-session="{sid}"] [data-waiting-for-operator]').count():
                    break
                await page.wait_for_timeout(500)
            await expect(page.locator(f'li[data-session="{sid}"]')).to_contain_text("waiting for you: an agent asks")
            url = f"{site.url}/sessions/{sid}"
            region = await waiting_region(page, url, "May the agent use Bash?")
            await expect(region.locator("pre.tool-input")).to_contain_text("asked.txt")
            await region.get_by_role("button", name="Allow").click()
            await expect(page.get_by_text(": answered allow")).to_be_visible()
            region = await waiting_region(page, url, "Which colour should the button be?")
            await region.get_by_role("button", name="blue").click()
            await expect(page.get_by_text(": answered blue")).to_be_visible()
            out, err = launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
            site.stop()
        results = tool_results(model)
    assert launcher.returncode == 0, (out, err)
    assert any('"blue"' in r for r in results), results
    answered = json.loads(site.cli("session", "questions", sid, "--json"))
    assert {(q["answer"], q["answered_by"]) for q in answered} == {
        ("allow", "operator:alice"),
        ("blue", "operator:alice"),
    }
