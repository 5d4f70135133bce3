"""Codex as an operator's MCP client of `taskgate serve` over stdio, configured as docs/mcp.md says: the tools of
taskgate are Codex's to call in its first turn.

Codex gives an optional MCP server one second to start before it builds a turn's tools, and leaves out one still
starting (openai/codex#31641); `serve` used to take ~2 s to list its tools, so the model never saw taskgate
(issue 43). docs/mcp.md's entry marks taskgate `required`, so Codex waits for it whatever the machine's load, and
`serve` now answers its tool list from the tool table before its database opens. The real Codex CLI runs against
the tests' scripted model server, whose second step calls a `save` tool of any MCP server Codex offers it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from taskgate.domain.agents.setups import codex_config
from tests.conftest import make_git_repo
from tests.support.agent_clis import require_cli, user_variables
from tests.support.model_server import ModelServer

TASKGATE = str(Path(sys.executable).with_name("taskgate"))


def test_codex_calls_taskgates_tools_in_its_first_turn(tmp_path: Path) -> None:
    codex = require_cli("codex")
    repo = make_git_repo(tmp_path / "shop")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    subprocess.run([TASKGATE, "init", "."], cwd=repo, env=env, check=True, capture_output=True, timeout=120)
    home = tmp_path / "codex-home"
    home.mkdir()
    config = repo / ".taskgate" / "taskgate.toml"
    entry = (  # docs/mcp.md's stdio entry, pointed at this repository's config
        f'[mcp_servers.taskgate]\ncommand = "{TASKGATE}"\nargs = ["serve"]\nrequired = true\n'
        f'env = {{ TASKGATE_CONFIG = "{config}" }}\n'
    )
    with ModelServer("ok") as model:
        # the user's own model provider (here the scripted server), then taskgate's entry
        (home / "config.toml").write_text(codex_config(f"{model.url}/v1") + "request_max_retries = 0\n\n" + entry)
        env |= {"CODEX_HOME": str(home)} | user_variables("codex", model.url)
        done = subprocess.run(
            [str(codex), "exec", "What is on my taskgate board?"],
            cwd=repo, env=env, capture_output=True, text=True, timeout=240, start_new_session=True,
        )  # fmt: skip
        turns = len(model.model_requests())
    said = done.stdout + done.stderr
    assert turns >= 2, said[-3000:]
    # Codex started a call of taskgate's save_output: the tool was in the turn (the call itself then needs an
    # approval `codex exec` never gives, which is Codex's policy, not taskgate's)
    assert "mcp: taskgate/save_output started" in said, said[-3000:]
