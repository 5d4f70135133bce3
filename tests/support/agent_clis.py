"""The real agent CLIs (Claude Code, Codex from npm; aider from PyPI) for end-to-end tests, installed once.

aider-chat goes into its own venv (`<cache>/aider-venv`, made with the running Python), pinned; measured here:
a cold install took 36 s (755 MB), a warm call checks the marker file.

Both are installed together into `${TASKGATE_TEST_CACHE:-~/.cache/taskgate-tests}/npm` at pinned
versions, under a file lock so parallel test workers install once. Measured here (2 cores):
a cold install took 10 s (767 MB: both ship native binaries in per-platform npm packages), a warm
call only checks the marker file (0.1 s for the whole interpreter).

The MCP Inspector (`@modelcontextprotocol/inspector`, whose `mcp-inspector --cli` is a real MCP client on the
TypeScript SDK) goes the same way into `<cache>/inspector`: a cold install took 10 s (110 MB). Its package asks
for Node 22.19; its CLI runs on Node 20 as well (measured with 20.20).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLAUDE_CODE_VERSION = "2.1.330"
CODEX_VERSION = "0.169.0"

PACKAGES = {
    "claude": ("@anthropic-ai/claude-code", CLAUDE_CODE_VERSION),
    "codex": ("@openai/codex", CODEX_VERSION),
}

INSTALL_TIMEOUT = 600


INSPECTOR_VERSION = "2.12.0"
INSPECTOR = {"@modelcontextprotocol/inspector": INSPECTOR_VERSION}


class CliUnavailable(RuntimeError):
    """Node.js/npm missing or the install failed."""


class NpmInstallFailed(CliUnavailable):
    """Node.js and npm are there, but `npm install` failed or timed out."""


def cache_dir() -> Path:
    base = os.environ.get("TASKGATE_TEST_CACHE") or str(Path.home() / ".cache" / "taskgate-tests")
    return Path(base) / "npm"


def _wanted() -> dict[str, str]:
    return {package: version for package, version in PACKAGES.values()}


def _installed_ok(prefix: Path, wanted: dict[str, str] | None = None, bins: tuple[str, ...] = tuple(PACKAGES)) -> bool:
    marker = prefix / "installed.json"
    try:
        if json.loads(marker.read_text()) != (wanted or _wanted()):
            return False
    except (OSError, ValueError):
        return False
    return all((prefix / "node_modules" / ".bin" / name).exists() for name in bins)


def _install(prefix: Path, wanted: dict[str, str] | None = None) -> None:
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None:
        raise CliUnavailable("node or npm not found on PATH")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        major = int(version.lstrip("v").split(".")[0])
    except ValueError:
        major = 0
    if major < 20:
        raise CliUnavailable(f"node {version or '?'} is older than 20")
    wanted = wanted or _wanted()
    specs = [f"{package}@{version}" for package, version in wanted.items()]
    try:
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), *specs],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise NpmInstallFailed(f"npm install {' '.join(specs)} took over {INSTALL_TIMEOUT} s") from error
    if result.returncode != 0:
        raise NpmInstallFailed(f"npm install {' '.join(specs)} failed ({result.returncode}): {result.stderr[-2000:]}")
    (prefix / "installed.json").write_text(json.dumps(wanted))


AIDER_VERSION = "0.86.1"


def _aider() -> Path:
    """aider in its own venv, installed once (under a file lock) from PyPI."""
    venv = cache_dir().parent / "aider-venv"
    binary, marker = venv / "bin" / "aider", venv / "installed.txt"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "aider.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if binary.exists() and marker.exists() and marker.read_text() == AIDER_VERSION:
                return binary
            made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
            if made.returncode != 0:
                raise CliUnavailable(f"python -m venv failed: {made.stderr[-500:]}")
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"aider-chat=={AIDER_VERSION}"]
            done = subprocess.run(pip, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if done.returncode != 0 or not binary.exists():
                raise CliUnavailable(f"pip install aider-chat failed: {done.stderr[-1000:]}")
            marker.write_text(AIDER_VERSION)
            return binary
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def user_variables(name: str, model_url: str) -> dict[str, str]:
    """What a user exports to point the preset `name` at the model server at `model_url`: its key and its endpoint,
    nothing else (no CLI config, no agent table); {} for the scripted presets, which need no model."""
    if name == "claude":
        return {"ANTHROPIC_BASE_URL": model_url, "ANTHROPIC_API_KEY": "test-key"}
    if name == "codex":
        return {"OPENAI_BASE_URL": f"{model_url}/v1", "OPENAI_API_KEY": "test-key"}
    if name == "aider":
        return {"OPENAI_API_BASE": f"{model_url}/v1", "OPENAI_API_KEY": "test-key"}
    return {}


def cli_path(name: str) -> Path:
    """The bin path of `name` ("claude", "codex" or "aider"), installing it once if needed."""
    if name == "aider":
        return _aider()
    if name not in PACKAGES:
        raise ValueError(f"unknown agent CLI {name!r}")
    prefix = cache_dir()
    prefix.mkdir(parents=True, exist_ok=True)
    binary = prefix / "node_modules" / ".bin" / name
    if _installed_ok(prefix):
        return binary
    with open(prefix.parent / "npm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _installed_ok(prefix):
                try:
                    _install(prefix)
                except (OSError, subprocess.TimeoutExpired) as error:
                    raise CliUnavailable(str(error)) from error
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if not binary.exists():
        raise CliUnavailable(f"{binary} missing after install")
    return binary


def inspector_path() -> Path:
    """The MCP Inspector's launcher (`mcp-inspector`; `--cli` runs its command-line client), installed once at
    INSPECTOR_VERSION into `<cache>/inspector`. Raises: CliUnavailable (NpmInstallFailed when npm failed)."""
    prefix = cache_dir().parent / "inspector"
    binary = prefix / "node_modules" / ".bin" / "mcp-inspector"
    prefix.mkdir(parents=True, exist_ok=True)
    if _installed_ok(prefix, INSPECTOR, ("mcp-inspector",)):
        return binary
    with open(prefix.parent / "inspector.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _installed_ok(prefix, INSPECTOR, ("mcp-inspector",)):
                try:
                    _install(prefix, INSPECTOR)
                except OSError as error:
                    raise CliUnavailable(str(error)) from error
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if not binary.exists():
        raise NpmInstallFailed(f"{binary} missing after npm install")
    return binary


def require_inspector() -> Path:
    """`inspector_path()`. Without Node.js 20 and npm the test skips (fails when env CI is set), like
    `require_cli`; when npm is there but the install fails, the test fails and says why."""
    try:
        return inspector_path()
    except NpmInstallFailed as error:
        pytest.fail(f"could not install the MCP Inspector from npm: {error}")
    except CliUnavailable as error:
        message = f"needs Node.js 20 and npm: {error}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def require_cli(name: str) -> Path:
    """`cli_path(name)`, or skip the test (fail it when env CI is set) if it cannot be had."""
    try:
        return cli_path(name)
    except CliUnavailable as error:
        needs = "PyPI access for aider-chat" if name == "aider" else "Node.js 20 and npm"
        message = f"needs {needs}: {error}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
