"""The console's audit page shows the log's proofs (issue 21), in a real browser (Chromium) against a real `taskgate
serve --http`: the newest checkpoint and the last verification, signed and run through the server's own MCP tools
(`audit_checkpoint`, `audit_verify` over HTTP with alice's token), then the broken state once a transition row has
been changed by hand in the database and verified again."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from playwright.async_api import Browser, expect

from taskgate.infrastructure.audit.keys import create_key
from tests.e2e.test_console_browser import signed_in
from tests.e2e.test_mcp_transports import ok
from tests.support.console_site import ConsoleSite

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ConsoleSite]:
    """alice's console on SQLite with the audit key in its default place, and no periodic checkpoint (the test
    signs its own, so that their numbers are known)."""
    svc = ConsoleSite(tmp_path, TASKGATE_AUDIT__CHECKPOINT_INTERVAL_S="0")
    svc.seed("Parse totals")
    svc.cli("session", "start", "SHOP-1")
    create_key(Path(svc.env["TASKGATE_DATA_DIR"]) / "audit-key" / "signing-key.pem")
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@asynccontextmanager
async def mcp_as(site: ConsoleSite, who: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {site.tokens[who]}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http,
        Client(streamable_http_client(f"{site.url}/mcp", http_client=http), read_timeout_seconds=60) as client,
    ):
        yield client


async def linked(client: Client) -> None:
    """Wait (up to 10 s) until the server's linker has linked every record committed so far."""
    for _ in range(100):
        if (await ok(client, "audit_status"))["pending_records"] == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the server's linker left records pending for 10 s")


def tamper(site: ConsoleSite) -> int:
    """Change the actor of the first transition row, as someone with write access to the database would."""
    with sqlite3.connect(Path(site.env["TASKGATE_DATA_DIR"]) / "taskgate.db") as db:
        seq = db.execute("SELECT min(seq) FROM transition_log").fetchone()[0]
        db.execute("UPDATE transition_log SET actor = 'operator:mallory' WHERE seq = ?", (seq,))
    return seq


async def test_the_audit_page_shows_the_checkpoint_and_verification_then_the_broken_record(
    site: ConsoleSite, browser: Browser
) -> None:
    async with mcp_as(site, "alice") as client:
        signed = await ok(client, "audit_checkpoint")
        assert (await ok(client, "audit_verify"))["ok"]
        await linked(client)  # the verification's own event, by the server's linker (every second)
    page = await signed_in(browser, site, "alice")
    await page.goto(f"{site.url}/audit")
    proofs = page.get_by_role("region", name="Proofs")
    await expect(proofs.locator("[data-checkpoint]")).to_have_attribute("data-checkpoint", str(signed["number"]))
    await expect(proofs.locator("[data-checkpoint]")).to_contain_text(f"with key {signed['key']}")
    await expect(proofs.locator("[data-verified]")).to_have_attribute("data-verified", "ok")
    await expect(proofs.locator("[data-verified]")).to_contain_text(f"against checkpoint #{signed['number']}")
    # the verification's own audit.verified event is the one record no checkpoint covers yet
    await expect(proofs.locator("[data-unsigned]")).to_have_attribute("data-unsigned", "1")
    await expect(page.locator("table.timeline tbody tr").first).to_be_visible()  # the log is still below

    seq = tamper(site)
    async with mcp_as(site, "alice") as client:
        report = await ok(client, "audit_verify")
    assert not report["ok"] and report["findings"][0]["where"] == f"transition_log {seq}"
    await page.reload()
    await expect(proofs.locator("[data-verified]")).to_have_attribute("data-verified", "broken")
    first = proofs.locator("[data-first-finding]")
    await expect(first).to_contain_text(f"transition_log {seq} (session:")
    await expect(first).to_contain_text("does not hash to its link")
