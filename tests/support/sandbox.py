"""What the sandbox tests need of the host: real bubblewrap (and nftables for the catch-all)."""

from __future__ import annotations

import os
import shutil

import pytest

from taskgate.infrastructure.sandbox import bwrap


def require_bwrap() -> str:
    """bwrap's path, once a real sandbox runs here; else the test fails in CI (which installs bubblewrap, nftables
    and iproute2: .ci/run, TASKGATE_TEST_REQUIRE_SANDBOX=1) and is skipped with the reason elsewhere, as the browser
    tests are without Chromium."""
    support = bwrap.probe()
    if support.available:
        return shutil.which("bwrap") or "bwrap"
    why = f"needs a working bubblewrap (apt-get install bubblewrap nftables iproute2): {support.detail}"
    if os.environ.get("TASKGATE_TEST_REQUIRE_SANDBOX"):
        pytest.fail(why)
    pytest.skip(why)
