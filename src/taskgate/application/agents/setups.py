"""What an agent's CLI needs on disk before it starts (the rules are in `domain/agents/setups.py`): Codex's private
CODEX_HOME with its model provider, and the worktree folders a CLI keeps made ignored by git. Also the check, before
anything is written, that the model endpoint the agent would use is complete."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath

from taskgate.application.agents.ports import AgentRunner
from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.agents.setups import (
    CODEX_ENDPOINT,
    CODEX_KEY,
    CODEX_LOGIN,
    codex_config,
    endpoint_problem,
)
from taskgate.domain.errors import InvalidInput


def agent_environment(runner: AgentRunner, kind: AgentType) -> dict[str, str]:
    """The variables the agent would see of its credentials: the service's (those `kind` passes) under the type's
    own `env` (where a variable set to "" blanks it). Only what is set is listed."""
    seen = runner.environment(kind.credentials) | dict(kind.env)
    return {name: value for name, value in seen.items() if value}


def check_endpoint(runner: AgentRunner, kind: AgentType) -> None:
    """Raises: InvalidInput when the endpoint `kind` would use is incomplete (an endpoint variable without a key, or
    not a URL), naming the agent type and the variables."""
    problem = endpoint_problem(kind.endpoint, kind.endpoint_keys, agent_environment(runner, kind))
    if problem:
        raise InvalidInput(f"agent type '{kind.name}': {problem}; set it in taskgate's environment "
                           f"(`taskgate doctor` checks it)")  # fmt: skip


def prepare(
    runner: AgentRunner, kind: AgentType, *, folder: str, agent_id: str, worktree: str, home_of: str | None = None
) -> dict[str, str]:
    """Write what `kind`'s CLI needs before it starts; returns the variables to add to its environment. `home_of`:
    the agent whose private CLI home this one uses (the one that began the conversation it continues), else its own.

    Raises: InvalidInput when its endpoint is not an http(s) URL (nothing is started)."""
    for name in kind.ignored:  # a `.gitignore` of `*` inside: git ignores the folder, the user's files unchanged
        runner.ignore_in_worktree(worktree, name)
    if kind.setup != "codex":
        return {}
    home = str(PurePosixPath(folder, f"{home_of or agent_id}.codex"))  # kept: a later run may continue its threads
    _codex_home(runner, home, agent_environment(runner, kind))
    return {"CODEX_HOME": home}


def _codex_home(runner: AgentRunner, home: str, env: Mapping[str, str]) -> None:
    """With a key: a provider from OPENAI_BASE_URL (OpenAI's API when unset). Without: Codex's own login copied in
    (from the service's CODEX_HOME, else ~/.codex), and no provider."""
    if env.get(CODEX_KEY):
        try:
            config = codex_config(env.get(CODEX_ENDPOINT))
        except ValueError as exc:
            raise InvalidInput(f"agent type codex: {exc}") from None
    else:
        config = "# Written by taskgate: no OPENAI_API_KEY, so Codex uses its own login (auth.json, copied here).\n"
        user_home = runner.environment(("CODEX_HOME",)).get("CODEX_HOME") or "~/.codex"
        login = runner.read_private(str(PurePosixPath(user_home, CODEX_LOGIN)))
        if login is not None:
            runner.write_private(str(PurePosixPath(home, CODEX_LOGIN)), login)
    runner.write_private(str(PurePosixPath(home, "config.toml")), config)
