"""The console shows what an agent ended with and what it did, in Chromium against a real `taskgate serve --http`:
the built-in feature-development workflow's plan step runs an agent replaying a REAL Claude Code stream-json run
whose result is a long plan; at the approve-plan step the session page shows the plan whole on its step (and says how
to print it), the agent's log as lines a person reads (tool calls, folded results, tokens) with a link to the raw
log, and the session's usage."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.test_cli_agent_output import DATA, PLAN, REPLAY
from tests.e2e.test_console_browser import card, signed_in
from tests.support.console_site import ConsoleSite

pytestmark = pytest.mark.slow


def served(root: Path) -> ConsoleSite:
    site = ConsoleSite(root, TASKGATE_WORKFLOWS__DEFAULT="feature-development")
    site.seed("Parse totals")
    (root / "replay.py").write_text(REPLAY)
    (root / "plan.md").write_text(PLAN)
    planner = [sys.executable, str(root / "replay.py"), str(DATA / "claude-stream.jsonl"), str(root / "plan.md"),
               "{prompt}"]  # fmt: skip
    config = site.repo / ".taskgate" / "taskgate.toml"
    text = config.read_text()
    text = text[: text.index("\n[agents.coder]\n")]  # the coder of this test plans (seed's slow coder goes)
    config.write_text(
        f'{text}\n[agents.coder]\ncommand = {json.dumps(planner)}\noutput_format = "claude-stream-json"\n'
    )
    site.start()
    return site


async def test_the_plan_shows_whole_on_its_step_the_log_reads_for_a_person_and_usage_adds_up(
    tmp_path: Path, browser: Browser
) -> None:
    site = served(tmp_path)
    try:
        page = await signed_in(browser, site, "alice")
        await page.get_by_role("button", name="Start SHOP-1").click()
        await card(page, "executing", "SHOP-1").get_by_role("link").click()
        await expect(page.get_by_text("Waits for an approval at step approve-plan")).to_be_visible()
        sid = page.url.rsplit("/", 1)[-1]
        await expect(page.locator("p.read")).to_contain_text(f"taskgate session output {sid} --step plan")

        plan = page.get_by_label("Output of step plan")
        await expect(plan).to_be_visible()  # open: the approval asks to read it
        assert (await plan.inner_text()).strip() == PLAN  # whole, not the tail of the raw stream

        await expect(page.locator("p.usage")).to_have_text("Usage: 1 agent, 4 turns, 400 in / 80 out tokens, $0.0032")
        log = page.get_by_label(re.compile("^Log of "))
        await expect(log).to_contain_text("→ Bash printf hello > hello.txt")
        text = await log.inner_text()
        assert "  ← [master (root-commit) afd5499] feat: hello … 2 more lines" in text
        assert "✓ done · 4 turns, 400 in / 80 out tokens, $0.0032" in text and '{"type"' not in text

        raw = page.get_by_role("link", name="Raw log (as written)")
        response = await page.request.get(site.url + await raw.get_attribute("href"))
        assert response.ok and response.headers["content-type"].startswith("text/plain")
        last = (await response.text()).strip().splitlines()[-1]
        assert json.loads(last)["type"] == "result" and json.loads(last)["result"] == PLAN
        missing = await page.request.get(f"{site.url}/sessions/{sid}/agents/nope/log")
        assert missing.status == 404
    finally:
        site.stop()
