"""Real MCP clients against a real `taskgate serve --http` without a token or with a bad one (issue 18): each shows
taskgate's own message and none starts OAuth; with a good token they list the tools.

taskgate takes static bearer tokens, not OAuth, and its gate answers a refusal 403 with a JSON-RPC error (see
`entrypoints/mcp/server.py`). Measured with 401, before: the MCP Inspector CLI 2.12 (TypeScript SDK 2.3) said
"auth_required: Interactive OAuth requires a TTY" without a terminal and "Dynamic Client Registration rejected
(HTTP 404): Not Found" with one; the Python SDK said "Server returned an error response", and with an OAuth
provider it fetched the protected-resource and authorization-server metadata and POSTed /register.

The Inspector comes from npm like the agent CLIs (`tests/support/agent_clis.py`, `<cache>/inspector`, 10 s and
110 MB cold): without Node.js and npm these tests skip (fail under CI); a failing npm install fails them.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from mcp.client import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPError

from taskgate.entrypoints.mcp.tools import TOOLS
from tests.conftest import make_git_repo
from tests.e2e.test_mcp_transports import (
    TASKGATE,
    _free_port,
    _wait_until_listening,
    run_cli,
    stop_server,
    taskgate_env,
)
from tests.support.agent_clis import require_inspector

MISSING = "a bearer token issued by `taskgate token create` is required"
UNKNOWN = "the bearer token is unknown or revoked"
REFUSALS = [(None, MISSING), ("tg_" + "x" * 43, UNKNOWN)]
REFUSAL_IDS = ["no token", "unknown token"]
RUN_TIMEOUT = 60
OAUTH_WORDS = ("OAuth", "oauth", "Registration", "authorize", "TTY")


@dataclass
class Served:
    url: str
    token: str
    workdir: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`taskgate serve --http` on a fresh project, and an operator token for alice."""
    workdir = tmp_path_factory.mktemp("mcp-auth")
    make_git_repo(workdir / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | taskgate_env(workdir)
    run_cli(workdir, env, "init", "repo", "--name", "demo")
    token = json.loads(run_cli(workdir, env, "token", "create", "--operator", "alice", "--json"))["token"]
    port = _free_port()
    log = workdir / "server.stderr"
    with log.open("w") as errlog:
        process = subprocess.Popen(
            [TASKGATE, "serve", "--http", "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog,
        )  # fmt: skip
    try:
        _wait_until_listening(process, port, log)
        yield Served(f"http://127.0.0.1:{port}/mcp", token, workdir)
        assert process.poll() is None, f"the server died: {log.read_text()}"
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        stop_server(process)


# -- the MCP Inspector CLI (TypeScript SDK) ---------------------------------------------------------------------


def inspector(served: Served, token: str | None, *extra: str) -> list[str]:
    """`mcp-inspector --cli URL --method tools/list`, with `Authorization: Bearer <token>` when a token is given."""
    header = ["--header", f"Authorization: Bearer {token}"] if token is not None else []
    return [str(require_inspector()), "--cli", served.url, *header, "--method", "tools/list", *extra]


def inspector_env(home: Path) -> dict[str, str]:
    """A HOME of its own (no stored OAuth state, no catalog), secrets in memory (no keychain)."""
    home.mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "MCP_INSPECTOR_SECRET_STORE": "memory"}


def envelope(stderr: str) -> dict:
    """The CLI's error envelope: the last line of stderr, `{"error": {"code", "message", "status"?}}`."""
    return json.loads(stderr.strip().splitlines()[-1])["error"]


@pytest.mark.parametrize(("token", "says"), REFUSALS, ids=REFUSAL_IDS)
def test_the_inspector_cli_shows_taskgates_message_and_starts_no_oauth(
    served: Served, tmp_path: Path, token: str | None, says: str
):
    done = subprocess.run(
        inspector(served, token), env=inspector_env(tmp_path / "home"), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert done.returncode != 0 and done.stdout == "", done.stdout
    error = envelope(done.stderr)
    assert says in error["message"] and error.get("status") == 403, done.stderr
    assert not any(word in done.stderr for word in OAUTH_WORDS), done.stderr  # with 401: "Interactive OAuth …"


def run_on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stdin and stderr on a pseudo-terminal (as a person would): (exit code, stdout, terminal output).
    The Inspector starts interactive OAuth on a 401 only when a person is there to complete it."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(argv, env=env, stdin=terminal, stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    shown: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the process closed its end
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stdout, _ = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
        reader.join(timeout=10)
        os.close(controller)
    return process.returncode, stdout, b"".join(shown).decode(errors="replace")


def test_the_inspector_cli_on_a_terminal_shows_taskgates_message_and_starts_no_oauth(served: Served, tmp_path: Path):
    code, stdout, shown = run_on_a_terminal(inspector(served, None), inspector_env(tmp_path / "home"))
    assert code != 0 and stdout == "", stdout
    assert MISSING in shown, shown
    assert not any(word in shown for word in OAUTH_WORDS), shown  # with 401: "Dynamic Client Registration …"


def test_the_inspector_cli_lists_the_tools_with_a_good_token(served: Served, tmp_path: Path):
    done = subprocess.run(
        inspector(served, served.token, "--format", "json"), env=inspector_env(tmp_path / "home"),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = {tool["name"] for tool in json.loads(done.stdout)["result"]["tools"]}
    assert names == {fn.__name__ for fn in TOOLS}


# -- the Python SDK client ----------------------------------------------------------------------------------------


class NoStoredAuth:
    """The OAuth provider's token storage: empty, and any attempt to register or store fails the test."""

    async def get_tokens(self) -> OAuthToken | None:
        return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        raise AssertionError("the client stored OAuth tokens")

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        raise AssertionError("the client registered itself with an OAuth server")


def oauth_provider(url: str) -> OAuthClientProvider:
    async def redirect(authorization_url: str) -> None:
        raise AssertionError(f"the client sent the user to {authorization_url}")

    async def callback() -> tuple[str, str | None]:
        raise AssertionError("the client waited for an OAuth callback")

    metadata = OAuthClientMetadata(redirect_uris=["http://127.0.0.1:9/callback"], client_name="taskgate test")
    return OAuthClientProvider(url, metadata, NoStoredAuth(), redirect_handler=redirect, callback_handler=callback)


async def list_tools(url: str, token: str | None, sent: list[str], *, oauth: bool = False) -> list[str]:
    """Connect with the SDK's client and list the tools; "METHOD path" of every HTTP request goes to `sent`."""

    async def record(request: httpx2.Request) -> None:
        sent.append(f"{request.method} {request.url.path}")

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        httpx2.AsyncClient(
            headers=headers, auth=oauth_provider(url) if oauth else None, event_hooks={"request": [record]},
            timeout=httpx2.Timeout(30.0, read=60.0),
        ) as http,
        Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as client,
    ):  # fmt: skip
        return [tool.name for tool in (await client.list_tools()).tools]


def the_error(raised: BaseException) -> BaseException:
    """The one exception inside the client's (nested) task-group exception groups."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(raised)
    assert len(leaves) == 1, leaves
    return leaves[0]


def paths(sent: list[str]) -> set[str]:
    return {line.split()[1] for line in sent}


@pytest.mark.parametrize("oauth", [False, True], ids=["plain", "with an OAuth provider"])
@pytest.mark.parametrize(("token", "says"), REFUSALS, ids=REFUSAL_IDS)
async def test_the_python_sdk_client_shows_taskgates_message_and_starts_no_oauth(
    served: Served, token: str | None, says: str, oauth: bool
):
    sent: list[str] = []
    with pytest.raises((MCPError, BaseExceptionGroup)) as raised:
        await list_tools(served.url, token, sent, oauth=oauth)
    error = the_error(raised.value)
    assert isinstance(error, MCPError) and str(error) == says, repr(error)
    # with 401 the OAuth provider went on to GET /.well-known/oauth-protected-resource/mcp, … and POST /register
    assert sent and paths(sent) == {"/mcp"}, sent


async def test_the_python_sdk_client_lists_the_tools_with_a_good_token(served: Served):
    for oauth in (False, True):
        sent: list[str] = []
        names = await list_tools(served.url, served.token, sent, oauth=oauth)
        assert set(names) == {fn.__name__ for fn in TOOLS}
        assert paths(sent) == {"/mcp"}, sent
