"""`taskgate doctor`'s forge lines: the remote, the token's variable, the API (it answers, the token is taken, the
repository is there), and how its events come in (webhooks, or polling only); and its tracker line."""

from __future__ import annotations

import os
from typing import Any

from taskgate.domain.errors import ForgeError, TaskgateError


def _line(name: str, status: str, detail: str, fix: str = "") -> tuple[str, str, str, str]:
    """A doctor line as (name, status, detail, fix): doctor makes its Check of it."""
    return name, status, detail, fix


async def forge_checks(settings: Any, app: Any, project: Any) -> list[tuple[str, str, str, str]]:
    """One line per part of the project's `[forge]`, each with its fix; nothing when no project has one."""
    if app.forges is None or project is None:
        return []
    cfg = app.forges.settings_of(project.name)
    if cfg.kind == "none":
        return [_line("forge", "ok", f"none for project {project.name}: sessions merge locally")]
    try:
        link = app.forges.for_project(project)
    except ForgeError as exc:
        return [_line("forge remote", "fail", str(exc), f"git remote add {cfg.remote} URL, or set [forge] remote")]
    checks = [_line("forge remote", "ok", f"{cfg.remote} → {link.api.repository} ({cfg.kind})")]
    if not os.environ.get(cfg.token_env):
        checks.append(_line("forge token", "fail", f"${cfg.token_env} is not set: nothing can be pushed or opened",
                            f"export {cfg.token_env}=<a token that can push and open pull requests>"))  # fmt: skip
        return checks
    checks.append(_line("forge token", "ok", f"${cfg.token_env} is set (kept from agents, files and logs)"))
    try:
        default = await link.api.check()
    except ForgeError as exc:
        checks.append(_line("forge api", "fail", str(exc), "check [forge] api_url, repository and the token"))
        return checks
    base = settings.git.base_branch
    same = "" if default == base else f" (its default branch is {default}; sessions target {base})"
    checks.append(_line("forge api", "ok", f"{cfg.api_url} answers for {link.api.repository}{same}"))
    if cfg.webhook_secret_env and os.environ.get(cfg.webhook_secret_env):
        events = f"webhooks at /forge/webhook (serve --http), polling every {cfg.poll_s:g} s as the fallback"
        checks.append(_line("forge events", "ok", events))
    else:
        why = f"${cfg.webhook_secret_env} is not set" if cfg.webhook_secret_env else "no webhook_secret_env"
        fix = "set [forge] webhook_secret_env and point the forge's webhook at /forge/webhook"
        checks.append(_line("forge events", "warn", f"polling only, every {cfg.poll_s:g} s ({why})", fix))
    return checks


async def tracker_checks(app: Any, project: Any) -> list[tuple[str, str, str, str]]:
    """The project's tracker: which one, and, read over an API, one poll's worth of candidates (the token is taken,
    the filter finds issues). Nothing for the built-in tracker."""
    sync = app.tracker.sync if project is not None else None
    if sync is None or sync.trackers.spec(project) is None:
        return []
    try:
        provider = sync.provider(project)
        candidates = await provider.list(project) if hasattr(provider, "describe") else await provider.ready(project)
    except TaskgateError as exc:
        return [_line("tracker", "fail", str(exc), "check [tracker] and its token variable (docs/trackers.md)")]
    what = provider.describe() if hasattr(provider, "describe") else provider.name
    ready = sum(1 for issue in candidates if issue.hold is None and not issue.closed)
    if not candidates:
        return [_line("tracker", "warn", f"{what}: no candidate issue", "check the filter (label, states, team)")]
    return [_line("tracker", "ok", f"{what}: {len(candidates)} candidate(s), {ready} ready")]
