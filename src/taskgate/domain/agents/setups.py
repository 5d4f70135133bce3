"""What taskgate sets up for a CLI before it starts, and whether the model endpoint it will use is complete (pure).

- setup "codex": Codex (0.169 and later) ignores `OPENAI_BASE_URL`; only a model provider in `$CODEX_HOME/config.toml`
  moves it to another endpoint. Each Codex agent gets a private `CODEX_HOME` in the session folder (never the user's
  `~/.codex`) whose `config.toml` holds a provider built from the agent's environment: `OPENAI_BASE_URL` (OpenAI's
  API when unset) and the key in `OPENAI_API_KEY` (`env_key`: the key itself is never written). Without a key,
  Codex's own login (`auth.json`) is copied in and no provider is written: Codex talks to OpenAI with that login.
- `ignored`: folders a CLI keeps in the worktree (aider's tags cache). Each gets a `.gitignore` of `*` before the
  CLI starts, so git ignores the folder and everything in it (the `.gitignore` too) without any change to the
  user's own ignore files, and the worktree stays clean for approval.
- `endpoint_problem`: a preset's endpoint variable set without a key for it is not a working set-up (a CLI's login
  is for its vendor's own API), nor is an endpoint that is not an http(s) URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

SETUPS = frozenset({"none", "codex"})
CODEX_PROVIDER = "taskgate"
OPENAI_API = "https://api.openai.com/v1"
CODEX_KEY = "OPENAI_API_KEY"
CODEX_ENDPOINT = "OPENAI_BASE_URL"
CODEX_LOGIN = "auth.json"
IGNORE_ALL = "*\n"
_URL = re.compile(r"https?://[^\s\"'\\]+")


def codex_config(base_url: str | None) -> str:
    """`config.toml` of a private CODEX_HOME: the provider at `base_url` (OpenAI's API when None), keyed by
    OPENAI_API_KEY, on the Responses API. Raises: ValueError when `base_url` is not an http(s) URL."""
    url = (base_url or OPENAI_API).rstrip("/")
    if not _URL.fullmatch(url):
        raise ValueError(f"{CODEX_ENDPOINT} is not an http(s) URL: {url!r}")
    return (
        "# Written by taskgate for one agent (docs/agents.md): Codex reads its model provider only from here.\n"
        f'model_provider = "{CODEX_PROVIDER}"\n\n'
        f"[model_providers.{CODEX_PROVIDER}]\n"
        f'name = "OpenAI-compatible endpoint (set by taskgate from {CODEX_ENDPOINT})"\n'
        f'base_url = "{url}"\n'
        f'env_key = "{CODEX_KEY}"\n'
        'wire_api = "responses"\n'
    )


def endpoint_problem(variables: Sequence[str], keys: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why the endpoint the CLI would use is not complete, or None: an endpoint variable of `variables` set in
    `env` needs one of `keys` set too, and must be an http(s) URL."""
    for name in variables:
        value = env.get(name)
        if not value:
            continue
        if not _URL.fullmatch(value.rstrip("/")):
            return f"{name} is not an http(s) URL"
        if keys and not any(env.get(key) for key in keys):
            return f"{name} is set but {' or '.join(keys)} is not (a CLI's own login is for its vendor's API)"
    return None


def endpoint_of(variables: Sequence[str], env: Mapping[str, str], *, setup: str = "none", model: bool = True) -> str:
    """The model endpoint a CLI would use with `env`, for people: `URL (from NAME)` for the first endpoint variable
    set, else its default (`model`: whether the type needs a model at all)."""
    found = next((f"{env[name]} (from {name})" for name in variables if env.get(name)), None)
    if found:
        return found
    if not variables:
        return "the CLI's own" if model else "none (no model)"
    default = "OpenAI's API" if setup == "codex" else "the CLI's default"
    return f"{default} ({' or '.join(variables)} unset)"


def inside_sandbox(setup: str, command: Sequence[str]) -> list[str]:
    """The command as it runs inside taskgate's sandbox. Codex's own sandbox is replaced by
    `--sandbox danger-full-access` and its `--add-dir`s of the project's git dir are dropped: ours is the boundary
    (it confines Codex and every process it starts), and Codex's `workspace-write` keeps `.git` read-only, so its
    commits would fail; nesting its bubblewrap in ours adds nothing we rely on (docs/decisions.md)."""
    if setup != "codex":
        return list(command)
    out: list[str] = []
    parts = iter(command)
    for part in parts:
        if part == "--add-dir":
            next(parts, None)
            continue
        if part == "--sandbox":
            next(parts, None)
            out += ["--sandbox", "danger-full-access"]
            continue
        out.append(part)
    return out
