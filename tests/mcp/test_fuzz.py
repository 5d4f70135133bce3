"""Property-based fuzzing (hypothesis) of every MCP tool's arguments, through the SDK's in-process Client.

Every tool the server registers is called with arguments drawn, per parameter, from values that pass its
schema (the seeded sessions, their prefixes, real and unknown task ids, ISO timestamps including the extremes
of `datetime`, triggers, text exactly at each `max_length`), values that just miss it (one character or one
unit over a bound, integers past what a version or id column holds, near-miss literals) and hostile ones
(wrong JSON types, None, nested lists and dicts, floats, bools, huge and negative numbers, 100,000-character
strings, NUL, RTL marks, emoji, lone surrogates, injection-looking text such as `'; DROP TABLE sessions; --`,
`../../etc/passwd`, `--upload-pack=x`, `$(rm -rf ~)`, `{{7*7}}`), with parameters left out and unknown ones
added. Each call is in one of three moods: clean (all valid: reaches the use cases), one bad parameter, or
chaos.

Each (tool, caller) pair gets its own copy of one seeded SQLite database (a project, a plan, four tasks the
last blocked by the first, one session in `planning`, one `suspended`; WIP limit 2), restored every
`RESET_EVERY` calls, and is fuzzed as the local operator `alice` and as an agent whose token is scoped to the
planning session. The server runs a workflow runtime (`FUZZ_WORKFLOWS`, with scripted agents that exit at once),
so the stack tools reach their use cases; after each call the harness waits until the drivers and agents the
call set off have ended. Unknown tool names, and mixed sequences of calls to any tools, are fuzzed too.

Invariants, per call:
- no exception escapes `Client.call_tool`;
- an error result has non-empty text with no "Traceback" and no 'File "';
- a refused call leaves the database as it was (see `Harness.check_refusal` for how that is checked cheaply,
  and for the one documented exception: a guard refusal appends its `blocked` row to the history);
- a successful call returns structured content with a summary; an agent succeeds only on its own session,
  with read tools and the triggers agents may fire;
- no tool crashes: a call that ends in an exception taskgate did not turn into a reason (answered "Error executing
  tool X: Unexpected <type>: …" and logged with its traceback; the SDK's bare "Error executing tool X" before
  `tool_errors` said more) is recorded with the smallest arguments seen for it, and `test_no_tool_crashed` fails
  listing them.

The examples are derandomized (`derandomize=True`, no example database), so CI runs are reproducible.
`test_zz_cases_executed` counts the calls actually made and requires at least 2,000 (and 90% of the budget).

    .venv/bin/pytest tests/mcp/test_fuzz.py -q                                  # ~2,400 calls, ~25 s
    .venv/bin/pytest tests/mcp/test_fuzz.py -q -s                               # ... and print the tally
    TASKGATE_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/mcp/test_fuzz.py -q    # heavy: ~20,000 calls, ~2.5 min

`TASKGATE_FUZZ_EXAMPLES` (default 2400) is the total budget, split by `_budget`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import shutil
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import UnexpectedToolError

from taskgate.domain.access import AGENT_TRIGGERS, Principal
from taskgate.domain.bounds import INT32_MAX
from taskgate.domain.states import SessionState, Trigger
from taskgate.entrypoints.mcp.server import build_server
from taskgate.entrypoints.mcp.tools import TOOLS
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.tables import ALL_TABLES
from tests.builders import fire, seed, start
from tests.conftest import Services, make_git_repo, wire
from tests.mcp.conftest import app_of
from tests.workflow_support import Rig, rig

TOTAL_EXAMPLES = int(os.environ.get("TASKGATE_FUZZ_EXAMPLES", "2400"))
TOOL_NAMES = [fn.__name__ for fn in TOOLS]
UNKNOWN = "(unknown tool)"
MIXED = "(mixed sequences)"
CALLERS = ("operator", "agent")
RESET_EVERY = 25
"""Calls between two restores of the seeded database, so that state-changing tools keep finding live sessions."""


def _parameter_count(fn: Any) -> int:
    """How many arguments a tool takes (its `Context` is injected, not an argument)."""
    return sum(1 for p in inspect.signature(fn).parameters.values() if p.annotation is not Context)


def _budget(total: int) -> dict[tuple[str, str], int]:
    """(caller, tool) → examples: 5% for unknown tool names, 4% for mixed sequences of 1-4 calls (~10% of the
    calls), the rest split by 2 + the tool's argument count (audit_query's seven arguments get more cases than
    ping's none), three quarters of each as the operator and one quarter as the agent."""
    unknown, mixed = max(4, total // 20), max(2, total // 25)
    weights = {fn.__name__: 2 + _parameter_count(fn) for fn in TOOLS}
    unit = (total - unknown - 2.5 * mixed) / sum(weights.values())
    budget = {("operator", UNKNOWN): unknown, ("mixed", MIXED): mixed}
    for tool, weight in weights.items():
        share = max(4, int(unit * weight))
        budget[("operator", tool)], budget[("agent", tool)] = share - share // 4, share // 4
    return budget


BUDGET = _budget(TOTAL_EXAMPLES)
CALL_TIMEOUT_S = 60
MIN_CASES = 2000

EXECUTED: Counter[tuple[str, str]] = Counter()
"""(caller, tool) → calls actually made and checked."""
OUTCOMES: Counter[tuple[str, str]] = Counter()
"""(tool, outcome) → calls; outcome is ok, invalid arguments, the taskgate error's type, or internal error."""
COMPLETED: set[tuple[str, str]] = set()
"""The `BUDGET` keys whose fuzz test ran to the end."""
CRASHES: dict[tuple[str, str], tuple[str, str, str]] = {}
"""(tool, exception type) → (smallest arguments seen, caller, message) for calls that ended in an unexplained
internal error."""

AGENT_READS = {"ping", "session_status", "session_history", "session_state_at", "session_review", "context_discover",
               "policies_check"}  # fmt: skip
AGENT_FIRES = {"session_fire"}
AGENT_STOPS = {"session_stop"}  # a fail of its own session, as session_fire fail (Capability.FIRE, fail)
AGENT_WRITES = {"save_output",  # into the agent's own session folder
                "add_workflow_to_session", "add_checklist_to_session", "checklist_check",  # its own session's stack
                "workflow_advance", "workflow_back", "workflow_break", "workflow_restart"}  # fmt: skip
GUARD_LOGGED_TABLES = {"transition_log", "events", "sessions"}
FUZZ_WORKFLOWS = {
    "dev/feature.yaml": """
id: feature
description: The fuzzed servers' workflow - an agent step, an approval, a checklist
steps:
  - id: plan
    type: agent
    agent: ok
    prompt: plan {{task.title}}
  - id: approve
    type: approval
    message: Approve the plan.
  - id: check
    type: checklist
    checklist: quality-validation
""",
    "checklists/quality-validation.yaml": """
id: quality-validation
description: Two items
items:
  - id: tests-pass
    text: The tests pass.
  - id: docs-updated
    text: The docs say what changed.
    required: false
""",
}
"""The workflow runtime the fuzzed server runs: the names match the clean values of `workflow_name` and
`checklist_name`, so clean calls reach the engine's use cases (its agents are scripted and exit 0 at once)."""
SDK_SERVER_LOGGER = "mcp.server.mcpserver.server"
CRASH_LOGGERS = (SDK_SERVER_LOGGER, "taskgate.entrypoints.mcp.calls")  # the SDK's, and taskgate's `crashed`

# ----------------------------------------------------------------------------------------------------------------
# Strategies: hostile values
# ----------------------------------------------------------------------------------------------------------------

INJECTIONS = [
    "'; DROP TABLE sessions; --",
    "' OR '1'='1",
    '" OR 1=1 --',
    "../../etc/passwd",
    "/etc/passwd",
    "--upload-pack=x",
    "--output=/tmp/taskgate-fuzz",
    "-c core.sshCommand=touch /tmp/pwned",
    "$(rm -rf ~)",
    "`id`",
    "; ls -la",
    "|| true",
    "{{7*7}}",
    "${7*7}",
    "%s%s%s%n",
    "%",
    "%%%%",
    "____",
    "\\",
    "<script>alert(1)</script>",
    "file:///etc/passwd",
    "~",
    "~root",
    "~nosuchuser-taskgate",
    "null",
    "None",
    "NaN",
    "[]",
    "{}",
]
ODD_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\x00" * 8,
    "\u202egnp.exe",  # RTL override
    "\u200f\u200e",  # RLM, LRM
    "مرحبا بالعالم",
    "שלום",
    "🔥" * 10,
    "👩\u200d👩\u200d👧\u200d👦",
    "\ufeff",
    "\uffff",
    "\ud800",  # lone surrogates: Python's json reads the escapes "\ud800", so a JSON client can send them
    "\udfff",
    "\r\n\t\x0b\x0c",
    "\x1b[31mred\x1b[0m",
    "Ω" * 64,
    "²",  # str.isdigit() is True, int() refuses it
    "１２",  # fullwidth digits: int() reads them as 12
]
HUGE_LENGTHS = [64, 65, 100, 101, 200, 201, 500, 501, 2000, 2001, 4096, 4097, 20000, 20001, 100_000]
HUGE_CHARS = ["x", "\x00", "é", "🔥", "'", "%", "/"]
BIG_INTS = [-1, 0, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30,
            -(10**30)]  # fmt: skip
OUT_OF_RANGE = [0, -1, INT32_MAX + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]
"""Integers past what a version or id column holds (domain/bounds.py): each must be refused by name, never reach
the database (2**63 once ended project_decide in SQLite's OverflowError)."""

unicode_text = st.text(st.characters(exclude_categories=()), max_size=40)
"""Any code point, surrogates and NUL included."""
huge_text = st.builds(lambda char, n: char * n, st.sampled_from(HUGE_CHARS), st.sampled_from(HUGE_LENGTHS))
any_text = st.one_of(unicode_text, st.sampled_from(ODD_TEXT), st.sampled_from(INJECTIONS), huge_text)
big_int = st.one_of(st.integers(), st.sampled_from(BIG_INTS))
json_scalar = st.one_of(st.none(), st.booleans(), big_int, st.floats(allow_nan=False, allow_infinity=False), any_text)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)
hostile = st.one_of(json_value, st.lists(any_text, max_size=3), st.just([None]), st.just({"": None}))
extra_key = st.one_of(
    st.text(max_size=12), st.sampled_from(["ctx", "context", "self", "principal", "__proto__", "operator", "actor"])
)


class _Omit:
    """Marker: leave the parameter out of the call."""


OMIT = _Omit()


def is_surrogate_free(text: str) -> bool:
    """True when `text` has no lone surrogate (pydantic refuses those as strings, so they are never valid)."""
    return not any("\ud800" <= ch <= "\udfff" for ch in text)


def bounded_text(limit: int, min_size: int = 0) -> st.SearchStrategy[str]:
    """Strings a `max_length=limit` field accepts: short free text, odd and injection-looking text that fits,
    and text exactly `limit` long (ASCII, NUL, accents, emoji)."""
    fitting = [t for t in ODD_TEXT + INJECTIONS if min_size <= len(t) <= limit and is_surrogate_free(t)]
    full = [ch * limit for ch in HUGE_CHARS]
    free = st.text(st.characters(exclude_categories=("Cs",)), min_size=min_size, max_size=min(limit, 30))
    return weighted((2, free), (2, st.sampled_from(fitting)), (1, st.sampled_from(full)))


def over_limit(limit: int) -> st.SearchStrategy[str]:
    """Strings one character too long for a `max_length=limit` field, or far too long."""
    return st.sampled_from([ch * (limit + 1) for ch in HUGE_CHARS] + [ch * 100_000 for ch in HUGE_CHARS])


@dataclass(frozen=True)
class Domain:
    """A parameter's values: `valid` ones pass the tool's schema (they may still name nothing that exists);
    `edge` ones just miss it (one over a bound, a near-miss literal)."""

    valid: st.SearchStrategy[Any]
    edge: st.SearchStrategy[Any]


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Draw from one of `choices`, each (weight, strategy), with probability proportional to its weight."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


def mostly(values: list[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One of `values` three times in four, else a draw from `other`."""
    return weighted((3, st.sampled_from(values)), (1, other))


@st.composite
def arguments(draw: st.DrawFn, params: dict[str, Domain], required: frozenset[str]) -> dict[str, Any] | None:
    """A whole arguments object, in one of three moods: `clean` (every parameter valid; optional ones sometimes
    left out), `one` (one parameter edgy, hostile or missing, the rest valid: this reaches the code behind the
    schema) and `chaos` (each parameter anything); sometimes with unknown keys added, rarely None."""
    if draw(st.integers(0, 40)) == 0:
        return None
    mood = draw(st.sampled_from(["clean", "clean", "clean", "one", "one", "chaos"]))
    target = draw(st.sampled_from(sorted(params))) if params and mood == "one" else None
    values: dict[str, Any] = {}
    for name, domain in params.items():
        if mood == "chaos":
            value = draw(weighted((6, domain.valid), (1, domain.edge), (2, hostile), (1, st.just(OMIT))))
        elif name == target:
            value = draw(weighted((2, domain.edge), (2, hostile), (1, st.just(OMIT))))
        elif name in required:
            value = draw(domain.valid)
        else:
            value = draw(weighted((2, domain.valid), (1, st.just(OMIT))))
        if value is not OMIT:
            values[name] = value
    if draw(st.integers(0, 3)) == 0:
        return {**draw(st.dictionaries(extra_key, json_value, min_size=1, max_size=3)), **values}
    return values


# ----------------------------------------------------------------------------------------------------------------
# Strategies: valid and edgy values, by parameter name
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    """The seeded database file (copied per harness) and what the strategies need to know about it."""

    db_file: Path
    repo: Path
    spare_repos: tuple[Path, ...]
    project_id: int
    project_name: str
    project_key: str
    plan_id: int
    task_ids: tuple[str, ...]
    planning_session: str
    suspended_session: str


def timestamps() -> Domain:
    """ISO 8601 text: real moments with odd offsets, the extremes of `datetime`, malformed text."""
    offsets = st.builds(timezone, st.timedeltas(min_value=timedelta(hours=-23.9), max_value=timedelta(hours=23.9)))
    moments = st.datetimes(timezones=st.one_of(st.none(), st.just(UTC), offsets)).map(datetime.isoformat)
    fixed = [
        datetime.now(UTC).isoformat(),
        "2026-11-21T10:00:00Z",
        "2026-11-21",
        "0001-01-01T00:00:00+14:00",
        "0001-01-01T00:00:00",
        "9999-12-31T23:59:59-14:00",
        "9999-12-31T23:59:59.999999",
        "2026-02-30T00:00:00",
        "2026-11-21T25:00:00",
        "now",
        "",
        " 2026-11-21 ",
    ]
    return Domain(weighted((3, st.sampled_from(fixed)), (2, moments), (1, bounded_text(64))), over_limit(64))


def choice(values: list[Any], limit: int, edge: list[Any] | None = None) -> Domain:
    """Mostly `values`, else any text a `max_length=limit` field accepts; edge: too long, or `edge`."""
    return Domain(mostly(values, bounded_text(limit)), st.one_of(over_limit(limit), st.sampled_from(edge or [""])))


def numbers(values: list[Any], edge: list[Any], low: int | None = None, high: int | None = None) -> Domain:
    """Integers: mostly `values`, else any in [low, high]; edge: `edge` and numbers in the wrong JSON type."""
    wrong_type = ["1", 1.5, True, "1e3", 1e300, -0.0]
    other = big_int if low is None and high is None else st.integers(low, high)
    return Domain(mostly(values, other), st.sampled_from(edge + wrong_type))


def domains(seed: Seed) -> dict[str, Domain]:
    """Parameter name → its `Domain`, drawn around the seeded data."""
    a, b, key = seed.planning_session, seed.suspended_session, seed.project_key
    unknown = "00000000-0000-4000-8000-000000000000"
    sessions = [a, a, b, b, a[:8], a[:4], a[:3], b[:6], a.upper(), f"  {a}  ", a + "0", unknown]
    tasks = [*seed.task_ids, "NOPE-1", seed.task_ids[0].lower(), f"{key}-0", f"{key}--1", f"{key}-99999999999999999999"]
    projects = [str(seed.project_id), seed.project_name, key, key.lower(), "0", "2", "-1", "²", "１", "2147483648"]
    paths = [str(seed.repo), *map(str, seed.spare_repos), f"{seed.repo}/../{seed.repo.name}", str(seed.repo.parent),
             "taskgate-fuzz.md", "taskgate-fuzz/out.txt", "../taskgate-fuzz.txt", "a/../../taskgate-fuzz"]  # fmt: skip
    task_refs = mostly(tasks, bounded_text(64))
    workflow_ids = ["feature", "quality-validation", "nope", "a" * 100, "-x", "../feature"]
    return {
        "session_id": Domain(mostly(sessions, bounded_text(64, min_size=1)), st.sampled_from(["", "x" * 65])),
        "trigger": choice([t.value for t in Trigger] + ["START", " start", "create"], 64),
        "reason": Domain(st.one_of(st.none(), bounded_text(2000)), over_limit(2000)),
        "expected_version": Domain(
            weighted((3, st.none()), (1, numbers([1, 4, 5, 6, INT32_MAX], [], 1, INT32_MAX).valid)),
            st.one_of(st.sampled_from(OUT_OF_RANGE), hostile),
        ),
        "task_id": choice(tasks, 64),
        "operator_id": choice([None, "alice", "bob", "ALICE", "", "alice "], 100),
        "project": choice([None, *projects], 200),
        "plan_id": numbers([None, seed.plan_id, 2, 99, INT32_MAX], OUT_OF_RANGE, 1, INT32_MAX),
        "priority": numbers([0, 1, 2, 3, 4], [-1, 5, *BIG_INTS, *OUT_OF_RANGE], 0, 4),
        "blocked_by": Domain(
            st.lists(task_refs, max_size=5) | st.lists(task_refs, min_size=100, max_size=100),
            st.lists(task_refs, min_size=101, max_size=101) | st.lists(over_limit(64), min_size=1, max_size=2),
        ),
        "title": Domain(bounded_text(500), over_limit(500)),
        "description": Domain(bounded_text(20_000), over_limit(20_000)),
        "name": Domain(st.one_of(st.none(), bounded_text(100)), over_limit(100)),
        "path": choice(paths, 4096),
        "limit": numbers([1, 2, 100, 10_000], [0, -1, 10_001, *BIG_INTS, *OUT_OF_RANGE], 1, 10_000),
        "timestamp": timestamps(),
        "since": Domain(st.one_of(st.none(), timestamps().valid), timestamps().edge),
        "until": Domain(st.one_of(st.none(), timestamps().valid), timestamps().edge),
        "state": choice([None, *(s.value for s in SessionState), "PLANNING"], 32),
        "outcome": Domain(st.sampled_from([None, "applied", "blocked"]), st.sampled_from(["APPLIED", "refused", ""])),
        "status": Domain(
            st.sampled_from([None, "open", "in_progress", "pending_review", "approved", "merged", "completed"]),
            st.sampled_from(["closed", "OPEN", ""]),
        ),
        "actor": choice([None, "operator:alice", "system", "agent:fuzz", "operator:"], 200),
        "content": Domain(bounded_text(200), st.sampled_from(["x" * 100_000, "\x00", "\ud800"])),
        "encoding": Domain(st.sampled_from(["text", "base64"]), st.sampled_from(["TEXT", "b64", "", None])),
        "workflow": choice([None, "feature", "nope", "../feature", "feature*"], 100),
        "workflow_name": Domain(mostly(workflow_ids, bounded_text(100, min_size=1)), over_limit(100) | st.just("")),
        "checklist_name": Domain(mostly(workflow_ids, bounded_text(100, min_size=1)), over_limit(100) | st.just("")),
        "item": Domain(
            mostly(["tests-pass", "docs-updated", "nope"], bounded_text(100, min_size=1)), over_limit(100) | st.just("")
        ),
        "pattern": choice([None, "feat*", "*", "[", "review", "%"], 200),
        "category": choice([None, "development", "testing", "ops"], 100),
    }


def tool_arguments(schema: dict[str, Any], seed: Seed) -> st.SearchStrategy[dict[str, Any] | None]:
    """Arguments for one tool, from its input schema: known parameters by name, hostile values for the rest."""
    known = domains(seed)
    params = {name: known.get(name, Domain(hostile, hostile)) for name in schema.get("properties", {})}
    return arguments(params, frozenset(schema.get("required", [])))


# ----------------------------------------------------------------------------------------------------------------
# The harness: one seeded database copy, one server, one connected client, on a private event loop
# ----------------------------------------------------------------------------------------------------------------


class _CrashLog(logging.Handler):
    """Collects the records of a crash ("failed unexpectedly", or the SDK's "raised an unexpected exception")
    instead of rendering their tracebacks."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.crashes: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            cause = exc.__cause__ if isinstance(exc, UnexpectedToolError) and exc.__cause__ else exc
            lines = str(cause).splitlines() or [""]
            self.crashes.append((type(cause).__name__, lines[0][:120]))


@contextmanager
def _sdk_log_captured() -> Iterator[_CrashLog]:
    """Route the crash loggers to a `_CrashLog` only: rich tracebacks take ~2 s to render per crash."""
    handler, loggers = _CrashLog(), [logging.getLogger(name) for name in CRASH_LOGGERS]
    saved = [(logger.handlers[:], logger.propagate, logger.level) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for logger, (handlers, propagate, level) in zip(loggers, saved, strict=True):
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)


def _short(value: Any, limit: int = 300) -> str:
    """`repr(value)`, cut to `limit` characters for messages."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass
class Harness:
    """A server over its own copy of the seeded database, a client connected to it, and the checks."""

    caller: str
    principal: Principal
    seed: Seed
    loop: asyncio.AbstractEventLoop
    services: Services
    client: Client
    watcher: sqlite3.Connection
    crash_log: _CrashLog
    runtime: Rig
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: tuple[int, dict[str, list]] | None = None
    calls: int = 0

    def reset(self) -> None:
        """Restore the seeded database in place (SQLite's backup API, through the watcher connection)."""
        with closing(sqlite3.connect(self.seed.db_file)) as source:
            source.backup(self.watcher)
        self.baseline = None

    def run(self, coro: Any) -> Any:
        """Run `coro` on the harness's loop (the client's task lives there too)."""
        return self.loop.run_until_complete(coro)

    def data_version(self) -> int:
        """SQLite's `PRAGMA data_version` on a separate connection: it moves whenever any other connection
        commits a change to the file, and only then, so it tells in microseconds whether a call wrote."""
        return self.watcher.execute("PRAGMA data_version").fetchone()[0]

    def snapshot_before(self) -> dict[str, list]:
        """Every row of every table as of now; reused while `data_version` has not moved."""
        version = self.data_version()
        if self.baseline is None or self.baseline[0] != version:
            self.baseline = (version, self.run(self.services.snapshot()))
        return self.baseline[1]

    def call(self, tool: str, args: dict[str, Any] | None, counted_as: str | None = None) -> None:
        """Call `tool` with `args` and check every invariant; count the call (under `counted_as` if given)."""
        if self.calls and self.calls % RESET_EVERY == 0:
            self.reset()
        self.calls += 1
        before = self.snapshot_before()
        crashes_before = len(self.crash_log.crashes)
        try:
            result = self.run(asyncio.wait_for(self.client.call_tool(tool, args), CALL_TIMEOUT_S))
            self.run(asyncio.wait_for(self.settle(), CALL_TIMEOUT_S))
        except Exception as exc:  # the invariant: nothing escapes the client call
            raise AssertionError(f"{tool}({_short(args)}) raised {type(exc).__name__}: {exc}") from exc
        EXECUTED[(self.caller, counted_as or tool)] += 1
        self.note_crash(tool, args, result, self.crash_log.crashes[crashes_before:])
        OUTCOMES[(counted_as or tool, _outcome(tool, result))] += 1
        if result.is_error:
            self.check_refusal(tool, args, result, before)
        else:
            self.check_success(tool, args, result)

    async def settle(self) -> None:
        """Until the workflow drivers and agents a call set off have ended: they write after the call returned,
        and must be done before `data_version` can tell what the next call wrote."""
        for _ in range(1000):  # each round awaits what is running; what those start is awaited next round
            groups = [*self.runtime.engine._tasks.values(), *self.runtime.agents._tasks.values()]
            running = [task for group in groups for task in group if not task.done()]
            if not running:
                return
            await asyncio.gather(*running, return_exceptions=True)
        raise AssertionError("workflow drivers and agents kept starting each other for 1,000 rounds")

    def note_crash(self, tool: str, args: Any, result: Any, logged: list[tuple[str, str]]) -> None:
        """Remember an unexplained internal error, keeping the smallest arguments per (tool, exception type)."""
        text = result.content[0].text if result.is_error and result.content else ""
        if not logged and not _crashed(tool, text):
            return
        kind, message = logged[0] if logged else ("(no log record)", text)
        shown = _short(args, 240)
        if (tool, kind) not in CRASHES or len(shown) < len(CRASHES[(tool, kind)][0]):
            CRASHES[(tool, kind)] = (shown, self.caller, message)

    def check_refusal(self, tool: str, args: Any, result: Any, before: dict[str, list]) -> None:
        """An error says something, shows no traceback, and wrote nothing.

        Cheap path: if `PRAGMA data_version` did not move, nothing was committed, so the database equals the
        snapshot taken before the call, without reading it again. Only when it moved is the full
        `Services.snapshot()` compared: a refusal may then only be a guard's (PolicyViolation), which by design
        appends its `blocked` row (and event, and for project_session_start the session it leaves `ready`) and
        changes no existing row. Why not snapshot every case: two full snapshots per call (~1.9 ms each on the
        seeded database, growing with it) would add ~40% to the run; `PRAGMA data_version` costs ~6 µs. The
        `before` snapshot is retaken only after a call that committed (see `snapshot_before`).
        """
        texts = [getattr(c, "text", "") for c in result.content]
        joined = "\n".join(texts)
        assert texts and joined.strip(), f"{tool}({_short(args)}): empty error"
        assert "Traceback" not in joined and 'File "' not in joined, f"{tool}({_short(args)}): {joined[:2000]}"
        if self.baseline is not None and self.data_version() == self.baseline[0]:
            return
        after = self.run(self.services.snapshot())
        self.baseline = None
        if "PolicyViolation" in joined:
            _assert_only_guard_log_appended(before, after, f"{tool}({_short(args)}): {joined[:300]}")
        else:
            changed = [t for t in after if _rows(after[t]) != _rows(before[t])]
            raise AssertionError(f"refused {tool}({_short(args)}) changed {changed}: {joined[:300]}")

    def check_success(self, tool: str, args: Any, result: Any) -> None:
        """A success carries structured content with a summary; an agent succeeds only on its own session."""
        out = result.structured_content
        assert isinstance(out, dict) and isinstance(out.get("summary"), str), f"{tool}({_short(args)}): {out}"
        if self.principal.session_id is None:
            return
        assert tool in AGENT_READS | AGENT_FIRES | AGENT_STOPS | AGENT_WRITES, f"agent allowed {tool}({_short(args)})"
        session = out.get("session", out) if tool != "ping" else {}
        if "id" in session or "session_id" in session:
            assert self.principal.session_id in (session.get("id"), session.get("session_id")), out["summary"]
        for row in out.get("transitions", []):
            assert row["session_id"] == self.principal.session_id, out["summary"]
        if tool in AGENT_FIRES:
            assert Trigger(out["trigger"]) in AGENT_TRIGGERS, out["summary"]


def _outcome(tool: str, result: Any) -> str:
    """What kind of answer `result` is, for the tally."""
    if not result.is_error:
        return "ok"
    text = result.content[0].text if result.content else ""
    if "validation error" in text:
        return "invalid arguments"
    found = re.match(rf"Error executing tool {re.escape(tool)}: (\w+):", text)
    return found.group(1) if found else "internal error" if _crashed(tool, text) else text[:30]


def _crashed(tool: str, text: str) -> bool:
    """Whether `text` answers a crash: `calls.crashed`'s words, or the SDK's bare ones."""
    bare = f"Error executing tool {tool}"
    return text == bare or text.startswith(f"{bare}: Unexpected ")


def _rows(rows: list) -> Counter[str]:
    """A table's rows as a multiset (JSON columns make the tuples unhashable)."""
    return Counter(repr(r) for r in rows)


def _assert_only_guard_log_appended(before: dict[str, list], after: dict[str, list], what: str) -> None:
    """A guard refusal changes no existing row, adds rows only to the history tables, and logs `blocked`."""
    outcome = [c.name for c in next(t for t in ALL_TABLES if t.name == "transition_log").columns].index("outcome")
    for table in after:
        old, new = _rows(before[table]), _rows(after[table])
        assert not old - new, f"guard refusal {what} changed or deleted rows of {table}"
        assert table in GUARD_LOGGED_TABLES or old == new, f"guard refusal {what} added rows to {table}"
    added = _rows(after["transition_log"]) - _rows(before["transition_log"])
    blocked = [r for r in after["transition_log"] if repr(r) in added and r[outcome] == "blocked"]
    assert blocked, f"guard refusal {what} logged no blocked row"


# ----------------------------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------------------------


async def _seed_database(db_file: Path, repo: Path) -> tuple[Services, Any, Any, Any]:
    """Project, plan, four tasks (the last blocked by the first), a `planning` and a `suspended` session."""
    database = Database(f"sqlite:///{db_file}", synchronous="NORMAL")
    services = wire("sqlite", database, database.url)
    seeded = await seed(services, repo, tasks=4, blocked_by_first=True)
    planning = await start(services, seeded.tasks[0])
    suspended = await fire(services, await start(services, seeded.tasks[1]), "suspend", reason="fuzz seed")
    async with database.connect() as conn:
        await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    await database.dispose()
    return services, seeded, planning, suspended


@pytest.fixture(scope="module")
def fuzz_seed(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Seed:
    """One seeded database file and git repositories, shared read-only by every harness of this module."""
    root = tmp_path_factory.mktemp("fuzz")
    db_file = root / "seeded.db"
    shutil.copy(sqlite_template, db_file)
    repo = make_git_repo(root / "repo")
    spares = tuple(make_git_repo(root / f"spare{i}") for i in range(2))
    _, seeded, planning, suspended = asyncio.run(_seed_database(db_file, repo))
    project = seeded.project
    return Seed(
        db_file,
        repo,
        spares,
        project.id,
        project.name,
        project.key,
        seeded.plan.id,
        tuple(t.id for t in seeded.tasks),
        planning.id,
        suspended.id,
    )


@asynccontextmanager
async def _connected(services: Services, principal: Principal, runtime: Rig) -> Any:
    """The taskgate server over `services` (with the workflow runtime `runtime`) with `principal` as the caller,
    and a client connected in-process."""

    @asynccontextmanager
    async def open_app() -> Any:
        yield app_of(services, workflows=runtime.engine, agents=runtime.agents)

    async with Client(build_server(open_app, local_principal=principal)) as client:
        yield client


async def _hold(
    services: Services, principal: Principal, runtime: Rig, ready: asyncio.Future, stop: asyncio.Event
) -> None:
    """Keep the client open in one task (anyio scopes must exit where they were entered) until `stop`."""
    try:
        async with _connected(services, principal, runtime) as client:
            ready.set_result(client)
            await stop.wait()
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(exc)
        raise


@contextmanager
def open_harness(seed: Seed, tmp_path: Path, caller: str) -> Iterator[Harness]:
    """A harness over a fresh copy of the seeded database, as the planning session's agent if `caller` is
    "agent", else as the operator alice; `caller` labels its calls in `EXECUTED`."""
    db_file = tmp_path / "fuzz.db"
    shutil.copy(seed.db_file, db_file)
    principal = Principal.agent("fuzz", seed.planning_session) if caller == "agent" else Principal.operator("alice")
    loop = asyncio.new_event_loop()
    database = Database(f"sqlite:///{db_file}", synchronous="NORMAL")
    services = wire("sqlite", database, database.url, wip_limit=2, outputs_root=tmp_path / "agent-outputs")
    runtime = rig(services, tmp_path / "runtime", FUZZ_WORKFLOWS)
    ready, stop = loop.create_future(), asyncio.Event()
    with _sdk_log_captured() as crash_log, closing(sqlite3.connect(db_file)) as watcher:
        holder = loop.create_task(_hold(services, principal, runtime, ready, stop))
        client = loop.run_until_complete(ready)
        harness = Harness(caller, principal, seed, loop, services, client, watcher, crash_log, runtime)
        try:
            # every tool's schema, also those an agent's tools/list leaves out: the agent calls them anyway and
            # must be refused (what a caller is shown is tested in test_visibility.py)
            every = build_server(_no_app, local_principal=None)  # type: ignore[arg-type]
            harness.schemas = {t.name: t.input_schema for t in harness.run(every.list_tools())}
            yield harness
        finally:
            stop.set()
            loop.run_until_complete(holder)
            loop.run_until_complete(services.database.dispose())
            loop.close()


@asynccontextmanager
async def _no_app() -> AsyncIterator[Any]:
    raise AssertionError("listing tools needs no app")
    yield  # pragma: no cover


def run_examples(strategy: st.SearchStrategy[Any], examples: int, body: Callable[[Any], None]) -> None:
    """`body(value)` for `examples` derandomized hypothesis draws of `strategy` (no example database).

    Every health check is off on purpose: the harness deliberately carries state from one example to the next,
    and drawing 100,000-character strings is slow by design."""

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(value=strategy)
    def case(value: Any) -> None:
        body(value)

    case()


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOL_NAMES)
@pytest.mark.parametrize("caller", CALLERS)
def test_tool_survives_any_arguments(fuzz_seed: Seed, tmp_path: Path, tool: str, caller: str):
    """Every registered tool, fuzzed as the operator and as an agent, keeps every invariant of the module."""
    with open_harness(fuzz_seed, tmp_path, caller) as harness:
        assert set(harness.schemas) == set(TOOL_NAMES), "the server's tools and TOOLS differ"
        strategy = tool_arguments(harness.schemas[tool], fuzz_seed)
        run_examples(strategy, BUDGET[(caller, tool)], lambda args: harness.call(tool, args))
    COMPLETED.add((caller, tool))


def test_unknown_tools_are_refused(fuzz_seed: Seed, tmp_path: Path):
    """Names that are not tools (near misses, the colon style, junk) are refused without writing."""
    near = (
        [f"{n}_" for n in TOOL_NAMES] + [n.upper() for n in TOOL_NAMES] + [n.replace("_", ":", 1) for n in TOOL_NAMES]
    )
    # No lone surrogates in names: the SDK client copies the name into a header and fails to encode it (client side).
    junk = any_text.filter(is_surrogate_free)
    names = mostly([*near, "", " ping", "tools/list", "__init__"], junk).filter(lambda name: name not in TOOL_NAMES)
    calls = st.tuples(names, st.one_of(st.none(), st.dictionaries(extra_key, json_value, max_size=3)))
    with open_harness(fuzz_seed, tmp_path, "operator") as harness:
        examples = BUDGET[("operator", UNKNOWN)]
        run_examples(calls, examples, lambda call: harness.call(*call, counted_as=UNKNOWN))
    COMPLETED.add(("operator", UNKNOWN))


def test_mixed_sequences_of_tools(fuzz_seed: Seed, tmp_path: Path):
    """Sequences of 1-4 calls to any tools, as the operator: state one tool leaves is what the next one meets."""
    with open_harness(fuzz_seed, tmp_path, "mixed") as harness:
        per_tool = {name: tool_arguments(schema, fuzz_seed) for name, schema in harness.schemas.items()}
        one_call = st.sampled_from(sorted(per_tool)).flatmap(lambda name: st.tuples(st.just(name), per_tool[name]))
        sequences = st.lists(one_call, min_size=1, max_size=4)
        run_examples(sequences, BUDGET[("mixed", MIXED)], lambda calls: [harness.call(*call) for call in calls])
    COMPLETED.add(("mixed", MIXED))


def _all_fuzz_tests_ran() -> bool:
    """Whether every fuzz test of the module ran to the end in this process (not so under -k, or after a failure)."""
    return set(BUDGET) <= COMPLETED


def test_no_tool_crashed():
    """No argument made a tool end in an unexplained internal error (the smallest arguments are listed)."""
    if not _all_fuzz_tests_ran():
        pytest.skip("run the whole module: this checks what the fuzz tests above recorded")
    lines = [
        f"{tool} as {caller}: {kind}: {message}\n    e.g. {args}"
        for (tool, kind), (args, caller, message) in sorted(CRASHES.items())
    ]
    assert not CRASHES, f"{len(CRASHES)} kind(s) of internal error:\n" + "\n".join(lines)


def test_zz_cases_executed():
    """The fuzz tests above really made at least 2,000 calls (and 90% of the budget; a budget under 2,000 is a
    quick run and needs only the 90%)."""
    if not _all_fuzz_tests_ran():
        pytest.skip("run the whole module: this counts the calls of the fuzz tests above")
    total = sum(EXECUTED.values())
    by_tool = Counter[str]()
    for (_, tool), n in EXECUTED.items():
        by_tool[tool] += n
    print(f"\nMCP fuzz: {total} calls (budget {TOTAL_EXAMPLES}):", dict(sorted(by_tool.items())))
    for tool in sorted(by_tool):
        kinds = sorted(((n, kind) for (t, kind), n in OUTCOMES.items() if t == tool), reverse=True)
        print(f"  {tool}: " + ", ".join(f"{kind} {n}" for n, kind in kinds))
    required = MIN_CASES if TOTAL_EXAMPLES >= MIN_CASES else 0.9 * TOTAL_EXAMPLES  # a smaller budget is a quick run
    assert total >= required, f"only {total} of {TOTAL_EXAMPLES} fuzz calls ran"
    assert total >= 0.9 * TOTAL_EXAMPLES, f"only {total} of {TOTAL_EXAMPLES} fuzz calls ran"
