"""Which forge each project has: `[forge]`, or `[projects.<name>.forge]` in its place, built once per project.

The repository (`owner/name`) is `[forge] repository`, else read from the remote's URL (`https://github.com/acme/
shop.git`, `git@github.com:acme/shop.git`, `http://127.0.0.1:8080/acme/shop.git` all give `acme/shop`). The token is
read from the variable `token_env` names when the project's forge is first used; a missing one is said by `doctor`
and by the first push, naming the variable.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING

from taskgate.application.forge.ports import ForgeLink
from taskgate.domain.entities import Project
from taskgate.domain.errors import ForgeError
from taskgate.domain.forge import Limits
from taskgate.infrastructure.forge.pushes import GitPushes

if TYPE_CHECKING:
    from taskgate.infrastructure.settings import ForgeSettings, Settings

_OWNER_NAME = re.compile(r"[:/]([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


class SettingsForges:
    """The ForgeDirectory of the settings: a project's link built at its first use and kept."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        self._settings, self._environ = settings, environ if environ is not None else os.environ
        self._links: dict[int, ForgeLink | None] = {}

    def configured(self) -> bool:
        """Whether any project has a forge (the forge loop runs only then)."""
        cfgs = [self._settings.forge, *(p.forge for p in self._settings.projects.values() if p.forge is not None)]
        return any(cfg.kind != "none" for cfg in cfgs)

    def settings_of(self, project_name: str) -> ForgeSettings:
        """The project's `[forge]` (its own, else the top-level one)."""
        own = self._settings.projects.get(project_name)
        return own.forge if own is not None and own.forge is not None else self._settings.forge

    def for_project(self, project: Project) -> ForgeLink | None:
        if project.id not in self._links:
            self._links[project.id] = self._build(project)
        return self._links[project.id]

    def webhook_secrets(self) -> list[str]:
        cfgs = [self._settings.forge, *(p.forge for p in self._settings.projects.values() if p.forge is not None)]
        names = {cfg.webhook_secret_env for cfg in cfgs if cfg.kind != "none" and cfg.webhook_secret_env}
        return [value for name in sorted(names) if (value := self._environ.get(name or ""))]

    def _build(self, project: Project) -> ForgeLink | None:
        cfg = self.settings_of(project.name)
        if cfg.kind == "none":
            return None
        repository = cfg.repository or repository_of(remote_url(project.root_path, cfg.remote))
        from taskgate.infrastructure.forge.github import GitHubForge  # githubkit and its models: ~0.3 s, when used

        token = self._environ.get(cfg.token_env, "")
        api = GitHubForge(cfg.api_url, repository, token, cfg.token_env)
        pushes = GitPushes(cfg.remote, cfg.token_env, self._environ)
        limits = Limits(cfg.max_ci_rounds, cfg.max_review_rounds, cfg.max_rebase_rounds, cfg.min_checks, cfg.auto_merge)
        secret = self._environ.get(cfg.webhook_secret_env) if cfg.webhook_secret_env else None
        return ForgeLink(cfg.kind, api, pushes, limits, cfg.merge_method, cfg.log_tail_lines, cfg.poll_s,
                         cfg.delete_branch, cfg.console_url, secret, cfg.draft)  # fmt: skip


def remote_url(root: str, remote: str) -> str:
    """The URL of the git remote `remote` in the repository at `root`. Raises: ForgeError naming the remote."""
    done = subprocess.run(["git", "-C", root, "remote", "get-url", remote], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ForgeError(f"the repository at {root} has no remote '{remote}' ([forge] remote): add it with "
                         f"`git remote add {remote} URL`, or name another")  # fmt: skip
    return done.stdout.strip()


def repository_of(url: str) -> str:
    """`owner/name` from a remote URL. Raises: ForgeError when the URL has no such path (set [forge] repository)."""
    found = _OWNER_NAME.search(url.strip())
    if found is None:
        raise ForgeError(f"cannot tell owner/name from the remote URL {redact_url(url)}: set [forge] repository")
    return f"{found.group(1)}/{found.group(2)}"


def redact_url(url: str) -> str:
    """A URL without the user and password it may carry (`https://user:token@host/…`)."""
    return re.sub(r"//[^/@]+@", "//", url)
