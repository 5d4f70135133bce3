"""The session folder's rules (pure): which output paths are allowed, and the manifest that describes the folder.

Every session owns `<data_dir>/agent-outputs/<session id>/`, with a `manifest.json` at its top. Agents write
files there through `save_output`; nothing they name may reach outside it. `output_path` is the first line of
that defence, on text alone: it refuses absolute paths, `..` and `.` components, empty components, backslashes
(a Windows separator elsewhere), drive letters, NUL and every other control or invisible format character,
lone surrogates, components that start with `.`, `-` or `~`, names that Unicode compatibility folding turns
into a separator or a dot component, over-long names and paths, and the reserved `manifest.json`. The adapter
then walks the folder without following any symbolic link (see `infrastructure/session_folder.py`).

The manifest is plain JSON data built by the functions below, so the supervisor, the MCP tool and the CLI all
write the same shape:

    {"version": 1, "session": ID, "task": {...}, "agents": [{...}], "started_at": ISO|null,
     "completed_at": ISO|null, "status": "open"|..., "outputs": [{"path", "bytes", "sha256", "at", "by"}],
     "inputs": {...}, "updated_at": ISO,
     "workflow": {"name", "description"} | {},           # the session's root workflow
     "execution": {"started_at", "completed_at", "status": running|completed|failed|cancelled, "user"},
     "agent": {"id", "name", "status"} | {},              # the agent launched last
     "related_sessions": [{"id", "state", "relation"}],   # other sessions of the same task (earlier attempts)
     "metadata": {"project_id", "plan_id", "branch", "worktree", "state", "taskgate_version"}}
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from taskgate.domain.errors import InvalidInput

MANIFEST_VERSION = 1
MANIFEST_NAME = "manifest.json"
MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 16
DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_OUTPUTS = 1000
DEFAULT_MAX_SESSION_BYTES = 256 * 1024 * 1024

_FORBIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
"""Control, format (bidi overrides, zero-width joiners, BOM), surrogate, private-use, unassigned, line/paragraph."""


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """How much one session folder may hold."""

    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_outputs: int = DEFAULT_MAX_OUTPUTS
    max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One file saved into a session folder, as its manifest lists it."""

    path: str
    bytes: int
    sha256: str
    at: str
    by: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def output_path(text: object) -> str:
    """`text` as a safe path relative to a session folder, NFC-normalised, components joined by `/`.

    >>> output_path("reports/tests.txt")
    'reports/tests.txt'

    Raises: InvalidInput naming what is wrong with the path.
    """
    if not isinstance(text, str):
        raise InvalidInput("the output path must be text")
    problem = _path_problem(text)
    if problem:
        raise InvalidInput(f"output path {_shown(text)} is refused: {problem}")
    return unicodedata.normalize("NFC", text)


def output_parts(path: str) -> list[str]:
    """The components of a path `output_path` accepted."""
    return output_path(path).split("/")


def _shown(text: str) -> str:
    return repr(text[:80] + ("…" if len(text) > 80 else ""))


def _path_problem(text: str) -> str | None:
    if not text or not text.strip():
        return "it is empty"
    if "\x00" in text:
        return "it contains a NUL character"
    if "\\" in text:
        return "it contains a backslash (use '/' between folders)"
    if text.startswith("/"):
        return "it is absolute (give a path relative to the session folder)"
    if len(text) >= 2 and text[1] == ":" and text[0].isascii() and text[0].isalpha():
        return "it starts with a drive letter"
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode text (lone surrogate)"
    if len(encoded) > MAX_PATH_BYTES:
        return f"it is longer than {MAX_PATH_BYTES} bytes"
    bad = next((ch for ch in text if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES), None)
    if bad is not None:
        return f"it contains the control or invisible character U+{ord(bad):04X}"
    parts = unicodedata.normalize("NFC", text).split("/")
    if len(parts) > MAX_DEPTH:
        return f"it is nested deeper than {MAX_DEPTH} folders"
    for part in parts:
        problem = _component_problem(part)
        if problem:
            return problem
    if parts[0].casefold() == MANIFEST_NAME:
        return f"{MANIFEST_NAME} at the top of the folder is taskgate's own"
    return None


def _component_problem(part: str) -> str | None:
    if not part:
        return "it has an empty component ('//' or a trailing '/')"
    if part in {".", ".."}:
        return f"it has a {part!r} component"
    folded = unicodedata.normalize("NFKC", part)
    if folded in {".", ".."} or "/" in folded or "\\" in folded:
        return f"component {part!r} reads as {folded!r} once Unicode-folded"
    if part[0] in ".-~":
        return f"component {part!r} starts with {part[0]!r} (hidden, option-like or home-relative names are refused)"
    if part != part.strip():
        return f"component {part!r} starts or ends with white space"
    if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
        return f"a component is longer than {MAX_COMPONENT_BYTES} bytes"
    return None


# -- the manifest ------------------------------------------------------------------------------------------------


def iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def new_manifest(session_id: str) -> dict[str, Any]:
    """An empty manifest of the session's folder."""
    return {
        "version": MANIFEST_VERSION,
        "session": session_id,
        "task": {},
        "agents": [],
        "started_at": None,
        "completed_at": None,
        "status": None,
        "outputs": [],
        "inputs": {},
        "updated_at": None,
        "workflow": {},
        "execution": {},
        "agent": {},
        "related_sessions": [],
        "metadata": {},
    }


def normalise_manifest(data: object, session_id: str) -> dict[str, Any]:
    """`data` read back from disk with every key present and of its type (anything else is reset).

    Raises: InvalidInput when `data` is not a manifest of this session (not an object, other version or session).
    """
    if not isinstance(data, dict):
        raise InvalidInput("manifest.json does not hold a JSON object")
    if data.get("version") != MANIFEST_VERSION or data.get("session") != session_id:
        raise InvalidInput(f"manifest.json is not a version {MANIFEST_VERSION} manifest of session {session_id}")
    blank = new_manifest(session_id)
    merged = {**blank, **data}
    for key, default in blank.items():
        if default is not None and not isinstance(merged[key], type(default)):
            merged[key] = default
    return merged


def with_header(manifest: dict[str, Any], task: dict[str, Any], started_at: datetime | None) -> dict[str, Any]:
    """Fill in the task and the start time where the manifest has none yet."""
    out = dict(manifest)
    if not out["task"]:
        out["task"] = dict(task)
    if out["started_at"] is None:
        out["started_at"] = iso(started_at)
    if out["status"] is None:
        out["status"] = "open"
    return out


def check_quota(manifest: dict[str, Any], path: str, size: int, limits: OutputLimits) -> None:
    """Refuse an output that would break the folder's limits (an overwrite replaces its old size).

    Raises: InvalidInput naming the limit.
    """
    if size > limits.max_output_bytes:
        raise InvalidInput(f"output {path!r} is {size} bytes; the limit is {limits.max_output_bytes} bytes per output")
    others = [o for o in manifest["outputs"] if o.get("path") != path]
    if len(others) + 1 > limits.max_outputs:
        raise InvalidInput(f"the session folder already lists {len(others)} outputs; the limit is {limits.max_outputs}")
    total = sum(int(o.get("bytes", 0)) for o in others) + size
    if total > limits.max_session_bytes:
        raise InvalidInput(
            f"saving {path!r} would bring the session's outputs to {total} bytes; "
            f"the limit is {limits.max_session_bytes} bytes per session"
        )


def with_output(manifest: dict[str, Any], record: OutputRecord, at: datetime) -> dict[str, Any]:
    """The manifest with `record` listed (replacing an earlier record of the same path)."""
    outputs = [o for o in manifest["outputs"] if o.get("path") != record.path] + [record.to_dict()]
    return {**manifest, "outputs": outputs, "updated_at": iso(at)}


def with_agents(
    manifest: dict[str, Any],
    agents: list[dict[str, Any]],
    at: datetime,
    *,
    status: str | None = None,
    started_at: datetime | None = None,
    completed_at: datetime | None = None,
) -> dict[str, Any]:
    """The manifest with `agents` merged in (an agent with the `id`, else `name`, of a listed one replaces it;
    others are appended) and, where given, the folder's status and times."""
    listed = [dict(a) for a in manifest["agents"]]
    for agent in agents:
        key = _agent_key(agent)
        index = next((i for i, a in enumerate(listed) if key is not None and _agent_key(a) == key), None)
        if index is None:
            listed.append(dict(agent))
        else:
            listed[index] = {**listed[index], **agent}
    out = {**manifest, "agents": listed, "updated_at": iso(at)}
    if agents:
        last = agents[-1]
        out["agent"] = {k: last.get(k) for k in ("id", "name", "status") if last.get(k) is not None}
    if status is not None:
        out["status"] = status
    if started_at is not None:
        out["started_at"] = iso(started_at)
    if completed_at is not None:
        out["completed_at"] = iso(completed_at)
    return out


def _agent_key(agent: dict[str, Any]) -> tuple[str, str] | None:
    for field in ("id", "name"):
        if agent.get(field) is not None:
            return field, str(agent[field])
    return None


def with_inputs(manifest: dict[str, Any], inputs: dict[str, Any], at: datetime) -> dict[str, Any]:
    """The manifest with `inputs` merged into its inputs (a key given again replaces the old value)."""
    return {**manifest, "inputs": {**manifest["inputs"], **inputs}, "updated_at": iso(at)}


# the manifest's execution status, by the session's state: the work runs until the session leaves the states
# where agents work on it; a request_changes that brings it back makes it `running` again
_EXECUTION_STATUS = {
    "verifying": "completed",
    "awaiting_merge": "completed",
    "merged": "completed",
    "completed": "completed",
    "failed": "failed",
    "rolled_back": "failed",
    "timed_out": "failed",
    "cancelled": "cancelled",
    "abandoned": "cancelled",
}


def execution_status(state: str) -> str:
    """running | completed | failed | cancelled, for a session in `state`."""
    return _EXECUTION_STATUS.get(state, "running")


def with_execution(manifest: dict[str, Any], facts: dict[str, Any], at: datetime) -> dict[str, Any]:
    """The manifest with its description brought up to date from `facts` (`state`, `user`, `started_at`,
    `workflow`, `related_sessions`, `metadata`; the ones given). `execution.completed_at` is set when the status
    leaves `running` (at `at`, once) and cleared when it is running again."""
    out = dict(manifest)
    previous = dict(out["execution"])
    status = execution_status(str(facts.get("state", "")))
    execution = {
        "started_at": previous.get("started_at") or facts.get("started_at") or iso(at),
        "completed_at": None if status == "running" else (previous.get("completed_at") or iso(at)),
        "status": status,
        "user": facts.get("user", previous.get("user")),
    }
    if previous.get("status") not in (None, status) and status != "running":
        execution["completed_at"] = iso(at)  # it ran again since it last ended
    out["execution"] = execution
    for key in ("workflow", "related_sessions", "metadata"):
        if key in facts and facts[key] is not None:
            out[key] = facts[key]
    out["updated_at"] = iso(at)
    return out
