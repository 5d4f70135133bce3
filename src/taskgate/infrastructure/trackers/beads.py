"""`BeadsTracker`: the tracker port over Beads' `bd` command line and its `--json` output.

`bd` runs as an argv list (never through a shell) in the project's root, bounded by a timeout; every way it
can fail becomes a `TrackerError` that names the command. The JSON fields read are listed in
docs/trackers.md; they are the ones of `types.Issue` in gastownhall/beads (formerly steveyegge/beads).

Both JSON shapes of bd are read: the legacy one (arrays as they are, `schema_version` injected into objects)
and the envelope `{"schema_version": 1, "data": …}` that `BD_JSON_ENVELOPE=1` turns on today and bd 2.0 makes
the default. An error object (`{"error": …}`, on stdout with `--json`) is bd's own words and is shown as such.
The first call checks `bd version --json` and refuses a bd older than MIN_VERSION, naming both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from taskgate.application.trackers.ports import TrackerIssue
from taskgate.domain.beads import CLOSED, is_valid_issue_id
from taskgate.domain.entities import Project, TaskStatus
from taskgate.domain.errors import ClaimRefused, InvalidInput, TaskNotFound, TrackerError

DEFAULT_STATUS_MAP: Mapping[str, str] = {"open": "open", "in_progress": "in_progress", "completed": CLOSED}
MIN_VERSION = (0, 49, 4)  # the first bd whose `update --claim` is a compare-and-swap and whose ready lists only open
INSTALL_HINT = "install Beads (https://github.com/gastownhall/beads)"
_STATUS_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_STDERR_TAIL = 500
_KILL_WAIT_S = 2.0


class BeadsTracker:
    """Reads issues with `bd ready|show|list --json`; writes task status back with `bd update`/`bd close`.

    `status_map` maps a taskgate task status to the Beads status to write (`closed` means `bd close`);
    statuses it leaves out write nothing, and `write_back=False` makes `set_status` a no-op.
    """

    name = "beads"

    def __init__(
        self,
        command: Sequence[str] = ("bd",),
        timeout_s: float = 10.0,
        write_back: bool = True,
        status_map: Mapping[str, str] | None = None,
    ) -> None:
        if not command or not all(isinstance(part, str) and part for part in command):
            raise InvalidInput('tracker.beads.command must be a non-empty list of strings, e.g. ["bd"]')
        if timeout_s <= 0:
            raise InvalidInput("tracker.beads.timeout_s must be positive")
        self._command, self._timeout_s, self._write_back = list(command), timeout_s, write_back
        self._status_map = _checked_status_map(DEFAULT_STATUS_MAP if status_map is None else status_map)
        self.writes_back = write_back
        self.version: str | None = None

    async def ready(self, project: Project) -> list[TrackerIssue]:
        """`bd ready`: Beads computes readiness (only `open` issues since 0.49.4; others are dropped all the same)."""
        data = await self._json(project, ["ready", "--limit", "0", "--sort", "priority"])
        issues = [_issue(item) for item in _as_list(data, "bd ready")]
        return [i for i in issues if i.status == "open"]

    async def show(self, project: Project, issue_id: str) -> TrackerIssue:
        """`bd show ID`. Raises: TaskNotFound (also for an id `bd` could never accept), TrackerError."""
        if not is_valid_issue_id(issue_id):
            raise TaskNotFound(issue_id)
        data = await self._json(project, ["show", issue_id], issue_id=issue_id)
        found = [_issue(item) for item in _as_list(data, "bd show")]
        match = next((i for i in found if i.id == issue_id), None)
        if match is None:
            raise TaskNotFound(issue_id)
        return match

    async def list(self, project: Project) -> list[TrackerIssue]:
        """`bd list --all --limit 0`: every issue, closed ones included, by id."""
        data = await self._json(project, ["list", "--all", "--limit", "0"])
        return sorted((_issue(item) for item in _as_list(data, "bd list")), key=lambda i: i.id)

    async def set_status(self, project: Project, issue_id: str, status: TaskStatus, reason: str = "") -> None:
        """Write `status` back as mapped. Raises: TaskNotFound, TrackerError, InvalidInput (bad id)."""
        if not is_valid_issue_id(issue_id):
            raise InvalidInput(f"{issue_id!r} is not a Beads issue id")
        target = self._status_map.get(TaskStatus(status).value)
        if not self._write_back or target is None:
            return
        if target == CLOSED:
            args = ["close", issue_id, f"--reason={reason or f'completed in taskgate ({status})'}"]
        elif TaskStatus(status) == TaskStatus.OPEN:
            args = ["update", issue_id, f"--status={target}", "--assignee="]  # back in the pool: release our claim
        else:
            args = ["update", issue_id, f"--status={target}"]
        await self._run(project, [*args, "--json"], issue_id=issue_id)

    async def claim(self, project: Project, issue_id: str, actor: str) -> None:
        """`bd update ID --claim`: Beads' compare-and-swap (open and unassigned, or ours already) sets us as the
        assignee and the status to in_progress, so two orchestrators never take the same issue.

        Raises: ClaimRefused with bd's words (claimed by someone else, not claimable), TaskNotFound, TrackerError.
        """
        if not is_valid_issue_id(issue_id):
            raise TaskNotFound(issue_id)
        try:
            await self._run(project, ["update", issue_id, "--claim", f"--actor={actor}", "--json"], issue_id=issue_id)
        except TrackerError as exc:
            if "claim" in str(exc):
                raise ClaimRefused(issue_id, str(exc)) from None
            raise

    async def check_version(self, project: Project) -> str:
        """`bd version --json`, once. Raises: TrackerError naming the version when it is older than MIN_VERSION."""
        if self.version is None:
            data = await self._json(project, ["version"], check=False)
            found = data.get("version") if isinstance(data, dict) else None
            if not isinstance(found, str):
                raise TrackerError(f"`{self._shown(['version', '--json'])}` printed no version: {str(data)[:200]}")
            if _version_tuple(found) < MIN_VERSION:
                oldest = ".".join(map(str, MIN_VERSION))
                raise TrackerError(f"bd {found} is older than {oldest}, the oldest taskgate supports (an atomic "
                                   f"`update --claim` and `ready` of open issues only); upgrade Beads")  # fmt: skip
            self.version = found
        return self.version

    # -- running bd -------------------------------------------------------------------------------------------

    async def _json(self, project: Project, args: list[str], issue_id: str | None = None, check: bool = True) -> Any:
        if check:
            await self.check_version(project)
        out = await self._run(project, [*args, "--json"], issue_id=issue_id)
        if not out.strip():
            return []
        return _unwrapped(_parsed(out, self._shown(args)), self._shown(args), issue_id)

    async def _run(self, project: Project, args: list[str], issue_id: str | None = None) -> str:
        """Run `bd args` and return its stdout. Raises: TrackerError; TaskNotFound when bd says `issue_id` is
        unknown."""
        argv = [*self._command, *args]
        root = Path(project.root_path)
        if not root.is_dir():
            raise TrackerError(f"cannot run `{self._shown(args)}`: project root {root} is not a directory")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=root,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, so a timeout kills children of wrappers too
            )
        except FileNotFoundError:
            raise TrackerError(
                f"`{self._command[0]}` was not found: {INSTALL_HINT} or set "
                "[tracker.beads] command in config/taskgate.toml (or TASKGATE_TRACKER__BEADS__COMMAND)"
            ) from None
        except PermissionError:
            raise TrackerError(f"`{self._command[0]}` is not executable; check [tracker.beads] command") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError:
            await _kill(proc)
            raise TrackerError(
                f"`{self._shown(args)}` did not finish within {self._timeout_s:g} s and was killed; "
                "raise [tracker.beads] timeout_s if bd is just slow"
            ) from None
        if proc.returncode != 0:
            said = _error_object(out) or err.decode(errors="replace").strip()[-_STDERR_TAIL:]
            said = said or "(no output on stderr)"
            if issue_id is not None and _says_not_found(said, issue_id):
                raise TaskNotFound(issue_id)
            raise TrackerError(f"`{self._shown(args)}` failed with exit code {proc.returncode}: {said}")
        return out.decode(errors="replace")

    def _shown(self, args: Sequence[str]) -> str:
        return " ".join([*self._command, *args])


def _parsed(out: str, shown: str) -> Any:
    try:
        return json.loads(out)
    except ValueError as exc:
        raise TrackerError(f"`{shown}` printed output that is not JSON: {exc}") from None


def _unwrapped(data: Any, shown: str, issue_id: str | None) -> Any:
    """The payload of bd's envelope (`{"schema_version", "data"}`); an error object becomes the error it says."""
    if isinstance(data, dict) and "schema_version" in data and "data" in data:
        data = data["data"]
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        if issue_id is not None and _says_not_found(data["error"], issue_id):
            raise TaskNotFound(issue_id)
        raise TrackerError(f"`{shown}`: {data['error']}")
    return data


def _error_object(out: bytes) -> str:
    """bd's own error text when it printed an error object on stdout (with `--json`), else ""."""
    try:
        data = json.loads(out.decode(errors="replace") or "null")
    except ValueError:
        return ""
    if isinstance(data, dict) and isinstance(data.get("data"), dict):
        data = data["data"]
    return data["error"] if isinstance(data, dict) and isinstance(data.get("error"), str) else ""


def _version_tuple(version: str) -> tuple[int, ...]:
    """ "1.0.3" → (1, 0, 3); "0.49.4-dev" → (0, 49, 4); anything else sorts as (0,)."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    return tuple(int(part or 0) for part in match.groups()) if match else (0,)


def _says_not_found(stderr: str, issue_id: str) -> bool:
    """bd's words for an unknown id: `Issue ID not found`, `no issue found matching "ID"`."""
    return re.search(rf"no issues? found|{re.escape(issue_id)}\S* not found", stderr, re.IGNORECASE) is not None


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), _KILL_WAIT_S)


def _checked_status_map(status_map: Mapping[str, str]) -> dict[str, str]:
    checked: dict[str, str] = {}
    for key, value in status_map.items():
        try:
            task_status = TaskStatus(key)
        except ValueError:
            raise InvalidInput(f"tracker.beads.status_map: unknown task status {key!r}") from None
        if not isinstance(value, str) or not _STATUS_RE.fullmatch(value):
            raise InvalidInput(f"tracker.beads.status_map: {value!r} is not a Beads status word")
        checked[task_status.value] = value
    return checked


def _as_list(data: Any, what: str) -> list[dict[str, Any]]:
    items = data if isinstance(data, list) else [data]
    if not all(isinstance(item, dict) for item in items):
        raise TrackerError(f"`{what} --json` returned something other than a list of issues")
    return items


def _issue(item: Mapping[str, Any]) -> TrackerIssue:
    """One issue of `bd … --json` (a `types.Issue`, `IssueWithCounts` or `IssueDetails`) as a TrackerIssue."""
    issue_id, title = item.get("id"), item.get("title")
    if not isinstance(issue_id, str) or not isinstance(title, str):
        raise TrackerError(f"bd returned an issue without a string id and title: {str(item)[:200]}")
    priority = item.get("priority", 2)
    return TrackerIssue(
        id=issue_id,
        title=title,
        description=_text(item.get("description")),
        status=_text(item.get("status")) or "open",  # Beads omits an empty status and reads it as open
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 2,
        issue_type=_text(item.get("issue_type")) or "task",
        labels=tuple(label for label in item.get("labels") or () if isinstance(label, str)),
        dependencies=tuple(_dependency(dep) for dep in item.get("dependencies") or () if isinstance(dep, dict)),
    )


def _dependency(dep: Mapping[str, Any]) -> tuple[str, str]:
    """A dependency record (`depends_on_id`/`type`: export, list) or a dependency issue (`id`/`dependency_type`:
    `bd show`)."""
    if "depends_on_id" in dep:
        return str(dep["depends_on_id"]), str(dep.get("type") or "blocks")
    return str(dep.get("id", "")), str(dep.get("dependency_type") or "blocks")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
