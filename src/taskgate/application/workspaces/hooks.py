"""Worktree lifecycle hooks (`[hooks]` in taskgate.toml, docs/worktrees.md) and `.worktreeinclude`.

A hook is a shell command run in the session's worktree at one point of its life, and a failure (a non-zero exit,
its timeout) does this:

- `after_create`, once the worktree exists and the `.worktreeinclude` files are in: the worktree and branch are
  removed and the session is cancelled (WorktreeNotCreated), like any worktree that could not be created;
- `before_agent`, before each agent's process starts: that agent is not started (it ends failed, the hook named);
- `after_agent`, after each agent's process ended on its own (not when taskgate stopped it): recorded, not blocking;
- `before_remove`, before a worktree that was set up in full is removed (merge's clean-up, auto_revert, cancel):
  recorded, not blocking (the worktree is removed anyway).

Each run appends its output to `hooks.log` in the session folder, under a line naming the hook and the time, and
is recorded as a `worktree.hook` event (hook, command, exit code, duration). A hook sees a small environment of its
own (`hook_env`), not the service's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from taskgate.application.agents.ports import SessionFolders
from taskgate.application.ports import Clock, UnitOfWorkFactory
from taskgate.application.sessions.engine import SessionService
from taskgate.application.workspaces.ports import HookResult, IncludedFiles, WorktreeSetup
from taskgate.domain.entities import Project, Session
from taskgate.domain.errors import HookFailed, InvalidInput, TaskgateError

HOOK_NAMES = ("after_create", "before_agent", "after_agent", "before_remove")
HOOKS_LOG = "hooks.log"
HOOK_EVENT = "worktree.hook"
INCLUDED_EVENT = "worktree.included"
MAX_TIMEOUT_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Hooks:
    """One project's hooks: a shell command per hook ("" for none), and the timeout every run gets."""

    after_create: str = ""
    before_agent: str = ""
    after_agent: str = ""
    before_remove: str = ""
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in HOOK_NAMES:
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidInput(f"hooks.{name} must be a shell command (a string), not {value!r}")
            if "\0" in value:
                raise InvalidInput(f"hooks.{name} holds a NUL character")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise InvalidInput(f"hooks.timeout_s must be seconds above 0 and at most 86400, not {timeout!r}")

    def configured(self) -> dict[str, str]:
        """The hooks that have a command, by name."""
        return {name: getattr(self, name) for name in HOOK_NAMES if getattr(self, name).strip()}


@dataclass(frozen=True, slots=True)
class HookBook:
    """Every project's hooks: `[hooks]` for all, `[projects.<name>.hooks]` instead of it for one project."""

    default: Hooks = field(default_factory=Hooks)
    projects: Mapping[str, Hooks] = field(default_factory=dict)

    def of(self, project_name: str) -> Hooks:
        return self.projects.get(project_name, self.default)


@dataclass(frozen=True, slots=True)
class HookRun:
    """A hook that ran: what, how it ended, and where its output is."""

    hook: str
    command: str
    result: HookResult
    log_path: str
    timeout_s: float

    @property
    def failed(self) -> bool:
        return not self.result.ok

    def message(self) -> str:
        """e.g. "hook after_create (`make setup`) exited 2 after 1.3 s: No rule to make target; see …/hooks.log"."""
        result, shown = self.result, _shorten(self.command, 200)
        if result.timed_out:
            how = f"was killed at its timeout of {self.timeout_s:g} s"
        elif result.exit_code is None:
            how = f"could not be started ({result.error})"
        else:
            how = f"exited {result.exit_code} after {result.duration_s:.1f} s"
        tail = f": {result.last_line}" if result.last_line else ""
        return f"hook {self.hook} (`{shown}`) {how}{tail}; see {self.log_path}"


class WorktreeHooks:
    """Runs the configured hooks of a session's worktree and copies its `.worktreeinclude` files, recording each."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        clock: Clock,
        setup: WorktreeSetup,
        book: HookBook,
        folders: SessionFolders,
        sessions: SessionService | None = None,
    ) -> None:
        self._uow, self._clock, self._setup, self._book, self._folders = uow, clock, setup, book, folders
        self._sessions = sessions

    def configured(self, project_name: str) -> dict[str, str]:
        """The project's hooks that have a command, by name."""
        return self._book.of(project_name).configured()

    async def include(self, session: Session, project: Project) -> IncludedFiles:
        """Copy the `.worktreeinclude` files into the session's new worktree; what was copied goes to hooks.log and
        a `worktree.included` event (nothing is recorded when the repository has no `.worktreeinclude`)."""
        assert session.worktree_path is not None
        included = await self._setup.copy_included(project.root_path, session.worktree_path)
        if not included.listed:
            return included
        lines = [f"=== .worktreeinclude {self._clock.now().isoformat()}: {len(included.copied)} file(s) copied"]
        lines += [f"copied {path}" for path in included.copied] + [f"skipped {why}" for why in included.skipped]
        await self._setup.append_log(await self._log_path(session.id), "\n".join(lines) + "\n")
        payload = {"copied": included.copied[:200], "skipped": included.skipped[:200], "count": len(included.copied)}
        await self._record(session.id, INCLUDED_EVENT, payload)
        return included

    async def run(
        self, hook: str, session: Session, project: Project, *, agent_id: str | None = None
    ) -> HookRun | None:
        """Run the project's `hook` in the session's worktree; None when it has none (or no worktree). Every run is
        in hooks.log and a `worktree.hook` event, whatever its end."""
        command = getattr(self._book.of(project.name), hook).strip()
        if not command or not session.worktree_path:
            return None
        timeout, env = self._book.of(project.name).timeout_s, hook_env(hook, session, project, agent_id)
        log_path = f"the session folder's {HOOKS_LOG}"
        try:
            log_path = await self._log_path(session.id)
            result = await self._setup.run_hook(
                hook, command, cwd=session.worktree_path, env=env, timeout_s=timeout, log_path=log_path
            )
        except TaskgateError as exc:  # its log cannot be written (a symbolic link planted there, a full disk)
            result = HookResult(None, 0.0, "", error=str(exc))
        done = HookRun(hook, command, result, log_path, timeout)
        payload: dict[str, Any] = {"hook": hook, "command": _shorten(command, 500), "exit_code": result.exit_code,
                                   "duration_s": round(result.duration_s, 3), "timed_out": result.timed_out,
                                   "last_line": result.last_line}  # fmt: skip
        if agent_id:
            payload["agent"] = agent_id
        if done.failed:
            payload["error"] = done.message()
        await self._record(session.id, HOOK_EVENT, payload)
        return done

    async def before_agent(self, session: Session, agent_id: str) -> None:
        """The `before_agent` hook, before an agent's process starts. Raises: HookFailed (the agent is not
        started)."""
        done = await self.run("before_agent", session, await self._project(session.project_id), agent_id=agent_id)
        if done is not None and done.failed:
            raise HookFailed(f"not started: {done.message()}", "before_agent")

    async def after_agent(self, session: Session, agent_id: str) -> str | None:
        """The `after_agent` hook, once an agent's process ended; its failure is recorded (and returned), never
        raised."""
        done = await self.run("after_agent", session, await self._project(session.project_id), agent_id=agent_id)
        return done.message() if done is not None and done.failed else None

    async def _log_path(self, session_id: str) -> str:
        return str(PurePosixPath(await self._folders.ensure(session_id), HOOKS_LOG))

    async def _project(self, project_id: int) -> Project:
        async with self._uow(write=False) as uow:
            return await uow.projects.get(project_id)

    async def _record(self, session_id: str, kind: str, payload: dict[str, Any]) -> None:
        async with self._uow(write=True) as uow:
            if self._sessions is not None:
                await self._sessions.fence(uow, session_id, f"the {kind} event")
            else:
                await uow.sessions.get(session_id, lock=True)
            await uow.events.append(kind, self._clock.now(), payload, session_id)
            await uow.commit()


def hook_env(hook: str, session: Session, project: Project, agent_id: str | None = None) -> dict[str, str]:
    """What a hook is told: who it runs for and where (the runner adds PATH and HOME of the service, and nothing
    else of its environment, which may hold credentials)."""
    env = {
        "TASKGATE_HOOK": hook,
        "TASKGATE_SESSION_ID": session.id,
        "TASKGATE_TASK_ID": session.task_id,
        "TASKGATE_WORKTREE": str(session.worktree_path),
        "TASKGATE_BRANCH": str(session.branch_name or ""),
        "TASKGATE_PROJECT_ROOT": project.root_path,
    }
    if agent_id:
        env["TASKGATE_AGENT_ID"] = agent_id
    return env


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
