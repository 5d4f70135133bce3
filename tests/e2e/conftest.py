"""Fixtures of the e2e tests that drive a browser."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, async_playwright, expect

from tests.support.console_site import chromium

# Playwright's assertions wait 5 s by default; agents, live updates and PostgreSQL on a loaded 2-core CI machine
# can take longer than that, and a wait that ends early is a false failure, not a finding.
expect.set_options(timeout=60_000)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium under Playwright, for one test (skipped with a reason where there is none, except in CI)."""
    path = chromium()
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()
