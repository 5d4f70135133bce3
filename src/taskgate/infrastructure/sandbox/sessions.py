"""`BwrapSandboxes`: the Sandboxes port: each agent's `SandboxPlan`, built from the session's paths, the agent
type and `[sandbox]`, and its session's private git dir (gitdir.py) kept in step with the project's branch."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from taskgate.domain.agents.kinds import AgentType
from taskgate.domain.entities import Session
from taskgate.domain.errors import InvalidInput, VcsError
from taskgate.domain.sandbox import Limits, SandboxPlan, SessionPaths, network_of, plan, refusals_in_log
from taskgate.infrastructure.git import _ENV, _git
from taskgate.infrastructure.sandbox import bwrap, gitdir, toolchain

RUN_ROOT = "/tmp"
SANDBOX_FOLDER = "sandbox"  # <data_dir>/sandbox/<session id>/: home, <agent>/ (tmp, refusals, specs), common.json
# <project's git dir>/taskgate-sandbox/<session id>/: the private git dir (`git`) and the `.git` file shown for the
# worktree (`dot-git`). Beside the project's objects, not in the node's data dir: a node that adopts the session
# (docs/nodes.md) sees commits an agent of the first node made there, and brings them home.
GIT_FOLDER = "taskgate-sandbox"


class BwrapSandboxes:
    """Sandboxes over bubblewrap. `mode`: "auto" (confined where bwrap works), "bwrap" (required), "off"."""

    def __init__(
        self, mode: str, data_dir: str, outputs_root: str, *, read: Sequence[str] = (), hide: Sequence[str] = (),
        write: Sequence[str] = (), limits: Limits | None = None, support: bwrap.Support | None = None,
    ) -> None:  # fmt: skip
        self._mode, self._data_dir, self._outputs_root = mode, os.path.realpath(data_dir), outputs_root
        self._read, self._hide, self._limits = tuple(read), tuple(hide), limits or Limits()
        self._write = tuple(os.path.realpath(p) for p in write)
        self._support = support  # probed at the first use (a bwrap run, ~10 ms), then kept
        self._catch_all: str | bool | None = False  # False: not probed yet; None: works; else why not

    def state(self) -> tuple[str, str]:
        if self._mode == "off":
            return "off", '[sandbox] mode = "off": agents run with the service\'s rights'
        if self._support is None:
            self._support = bwrap.probe()
        if self._support.available:
            return "bwrap", self._support.detail
        return ("unavailable" if self._mode == "bwrap" else "off"), self._support.detail

    async def prepare(
        self, session: Session, agent_id: str, kind: AgentType, command: Sequence[str], env: Mapping[str, str],
        mcp_url: str,
    ) -> SandboxPlan | None:  # fmt: skip
        mode, why = await asyncio.to_thread(self.state)
        if mode == "off":
            return None
        if mode == "unavailable":
            raise InvalidInput(f'the sandbox is required ([sandbox] mode = "bwrap") but unavailable: {why}')
        endpoint = next((env[name] for name in kind.endpoint if env.get(name)), None)
        network = network_of(kind.network, [endpoint] if endpoint else kind.hosts, mcp_url)
        return await asyncio.to_thread(self._prepare, session, agent_id, kind, command, env, network)

    def _prepare(
        self, session: Session, agent_id: str, kind: AgentType, command: Sequence[str], env: Mapping[str, str],
        network: str | tuple[str, ...],
    ) -> SandboxPlan:  # fmt: skip
        paths = self._paths(session)
        gitdir.prepare(paths.project_root, paths.worktree, str(session.branch_name), paths.git_dir, paths.dot_git)
        home = os.path.realpath(os.path.expanduser("~"))
        # the PATH the agent gets: the service's own (the runner passes it through) unless its type sets one
        shown = toolchain.prefixes(command, {"PATH": os.environ.get("PATH", os.defpath), **env}, home)
        # a short, private, unguessable folder: a Unix socket's path is at most 108 bytes (removed by agent_exec)
        run = tempfile.mkdtemp(prefix="taskgate-", dir=RUN_ROOT if os.path.isdir(RUN_ROOT) else None)
        sandbox = plan(paths, agent_id, toolchain=shown, read=[*self._read, *kind.read], hide=self._hide,
                       write=self._write, network=network, limits=self._limits, run_dir=run)  # fmt: skip
        if not isinstance(network, str):  # an allow-list: the catch-all records what it refuses (root only)
            sandbox = dataclasses.replace(sandbox, catch_all=self.catch_all() is None)
        for folder in (sandbox.home, sandbox.tmp):
            Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        common = os.path.dirname(paths.objects_dir)
        Path(paths.private_root, agent_id, "protected.json").write_text(json.dumps(_fingerprint(common)))
        return sandbox

    def _paths(self, session: Session) -> SessionPaths:
        if not session.worktree_path or not session.branch_name:
            raise InvalidInput(f"session {session.id} has no worktree: no agent can start in it")
        worktree = os.path.realpath(session.worktree_path)
        common = _common_of(worktree)
        project = os.path.dirname(common)
        private = os.path.join(self._data_dir, SANDBOX_FOLDER, session.id)
        shared = os.path.join(common, GIT_FOLDER, session.id)
        Path(private).mkdir(parents=True, exist_ok=True)
        Path(private, "common.json").write_text(json.dumps(common))  # for `discard`, once the worktree is gone
        outside = os.path.dirname(worktree)
        return SessionPaths(
            project_root=project, objects_dir=os.path.join(common, "objects"), worktree=worktree,
            git_dir=os.path.join(shared, "git"), dot_git=os.path.join(shared, "dot-git"),
            session_folder=os.path.realpath(os.path.join(self._outputs_root, session.id)), private_root=private,
            data_dir=self._data_dir, operator_home=os.path.realpath(os.path.expanduser("~")),
            worktrees_root="" if outside.startswith(project + os.sep) else outside,
            hooks_dir=os.path.join(common, "hooks"),
        )  # fmt: skip

    async def bring_back(self, session: Session) -> str | None:
        if not session.worktree_path or not session.branch_name or not os.path.exists(session.worktree_path):
            return None
        worktree = os.path.realpath(session.worktree_path)

        def home() -> str | None:
            common = _common_of(worktree)
            private = os.path.join(common, GIT_FOLDER, session.id, "git")
            if not os.path.isdir(private):
                return None  # no agent of this session ran confined: nothing to bring
            return gitdir.bring_back(os.path.dirname(common), worktree, session.branch_name or "", private,
                                     session.id)  # fmt: skip

        return await asyncio.to_thread(home)

    def catch_all(self) -> str | None:
        """None when connects to unlisted addresses are caught and recorded here, else why not (probed once)."""
        if self._catch_all is False:
            self._catch_all = bwrap.probe_catch_all()
        return self._catch_all or None

    async def refusals(self, session_id: str, agent_id: str, log: str) -> list[dict[str, str]]:
        """What the sandbox refused this agent: its network gate's records (exact: what, when), the refused writes
        its log names, and a breach of the project's git config or hooks if the fingerprint taken at its start
        changed (must never happen)."""
        private = os.path.join(self._data_dir, SANDBOX_FOLDER, session_id, agent_id)
        return await asyncio.to_thread(_refusals, private, log)

    async def discard(self, session_id: str) -> None:
        await asyncio.to_thread(self._discard, session_id)

    def _discard(self, session_id: str) -> None:
        private = os.path.join(self._data_dir, SANDBOX_FOLDER, session_id)
        with contextlib.suppress(OSError, ValueError):
            common = json.loads(Path(private, "common.json").read_text())
            if isinstance(common, str) and os.path.basename(session_id) == session_id:
                shutil.rmtree(os.path.join(common, GIT_FOLDER, session_id), ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _fingerprint(common: str) -> dict[str, str]:
    """What no agent may change in the project's git dir, by content: its config and its hooks."""
    found = {}
    for path in [Path(common, "config"), *sorted(Path(common, "hooks").glob("*"))]:
        with contextlib.suppress(OSError):
            found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _refusals(private: str, log: str) -> list[dict[str, str]]:
    records: list[dict[str, str]] = []
    with contextlib.suppress(OSError):
        for line in Path(private, "refusals.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                records.append({k: str(v) for k, v in json.loads(line).items()})
    records += refusals_in_log(log)
    with contextlib.suppress(OSError, ValueError):
        before = json.loads(Path(private, "protected.json").read_text())
        session_record = Path(private).parent / "common.json"  # written once per session by `_paths`
        common = json.loads(session_record.read_text()) if session_record.exists() else ""
        after = _fingerprint(common) if common else before
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                records.append({"what": "breach", "target": f".git/{name}", "source": "fingerprint"})
    return records


def _common_of(worktree: str) -> str:
    """The project's git dir (resolved) of a linked worktree: its admin folder's `commondir` (as git reads it),
    else git is asked. The admin folder must name the worktree back (its `gitdir` file), or VcsError."""
    admin = _linked_admin(worktree)
    try:
        common = Path(admin, "commondir").read_text().strip()
        back = Path(admin, "gitdir").read_text().strip()
    except OSError:
        common = _git(worktree, "rev-parse", "--path-format=absolute", "--git-common-dir",
                      env={**_ENV, "GIT_DIR": admin}).strip()  # fmt: skip
        return os.path.realpath(common)
    if os.path.realpath(back) != os.path.realpath(os.path.join(worktree, ".git")):
        raise VcsError(f"{worktree}/.git names an admin folder of another worktree ({admin})")
    return os.path.realpath(os.path.join(admin, common))


def _linked_admin(worktree: str) -> str:
    """The worktree's admin folder, from its `.git` file (`gitdir: <common>/worktrees/<name>`). Raises: VcsError."""
    try:
        text = Path(worktree, ".git").read_text().strip()
    except OSError as exc:
        raise VcsError(f"{worktree} is not a session worktree: {exc}") from None
    if not text.startswith("gitdir:"):
        raise VcsError(f"{worktree}/.git is not a worktree's gitdir file")
    return text.removeprefix("gitdir:").strip()
