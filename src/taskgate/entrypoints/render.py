"""Turning results into Rich tables, JSON and CSV for the CLI."""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from taskgate.domain.access import effective_permissions
from taskgate.domain.entities import Operator, Outcome, Session, StepRun, Task, TransitionRecord
from taskgate.domain.questions import Question

if TYPE_CHECKING:  # only named in annotations: the read commands' fast path prints without loading them
    from taskgate.application.sessions.guards import PolicyCheck
    from taskgate.application.sessions.policy_book import PolicyEntry
    from taskgate.application.workspaces.context import ProjectContext
    from taskgate.application.workspaces.ports import WorkspaceContext
    from taskgate.application.workspaces.reconcile import WorktreeRow
    from taskgate.domain.policies.facts import TestRun

# CSI (colours, cursor moves), OSC (titles, hyperlinks, clipboard) ended by BEL or ST, DCS/SOS/PM/APC ended by ST,
# and the other escape sequences; then every other control character but newline and tab (C0, DEL, C1 with U+0085),
# and the bidi overrides and isolates that show text in another order than it is (Trojan Source).
_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]" r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)" r"|\x1b[PX^_][^\x1b]*\x1b\\" r"|\x1b[ -/]*[0-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE = re.compile(f"{_ESCAPE.pattern}|{_CONTROL.pattern}")  # in one pass what `terminal_safe` cuts in two
# Rich drops some control characters (BEL, BS, CR...) as it builds a Text, and a BEL ends an OSC: each control
# character stands in for itself as a private-use character (plane 16) while Rich parses, so that what is cut after
# is what `terminal_safe` would cut.
_STAND_INS = {c: 0x100000 + c for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0),
                                        *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}  # fmt: skip
_STOOD_IN = {stand_in: c for c, stand_in in _STAND_INS.items()}


def terminal_safe(text: str) -> str:
    """`text` without anything a terminal would act on: escape sequences and control characters (newlines and
    tabs stay), and bidi overrides. Agent output, and every text the CLI prints, passes through it before it reaches
    the operator's terminal."""
    return _CONTROL.sub("", _ESCAPE.sub("", text))


def _without_unsafe(text: Text) -> Text:
    """`text` (built from a string whose control characters had stand-ins) without what `terminal_safe` drops;
    its styles stay on the characters that stay."""
    plain = text.plain.translate(_STOOD_IN)
    cuts = [offset for match in _UNSAFE.finditer(plain) for offset in match.span()]
    if not cuts:
        return text
    out = text.blank_copy()
    for kept in text.divide(cuts)[::2]:
        kept.style = ""  # the base style is out's already
        out.append_text(kept)
    return out


def safe_markup(markup: str, style: str = "") -> str | Text:
    """Rich markup whose text (not its tags) is terminal-safe: `markup` itself when it holds nothing a terminal
    acts on, else the Text it stands for without it. The markup is parsed first, then its text cleaned: cutting an
    escape sequence out of escaped markup first could make a tag of data (`[`, an OSC, `b]`; or ESC eating the
    backslash that escapes a `[`)."""
    if not _CONTROL.search(markup):
        return markup
    return _without_unsafe(Text.from_markup(markup.translate(_STAND_INS), style=style))


class SafeConsole(Console):
    """A Rich console that never prints anything a terminal would act on from the strings it is given (titles,
    names, reasons, errors and every other text, markup or not): Rich turns every string it prints, table cells
    included, into a Text here, and the escape sequences and control characters are cut from that Text. Rich's
    own styling (its escape sequences come later, from the styles) is untouched."""

    def render_str(self, text: str, **options: Any) -> Text:
        if not _CONTROL.search(text):
            return super().render_str(text, **options)
        return _without_unsafe(super().render_str(text.translate(_STAND_INS), **options))


console = SafeConsole()
if not console.is_terminal and "COLUMNS" not in os.environ:
    console.width = 120  # logs and pipes: wide enough for the transition table, still readable
err_console = SafeConsole(stderr=True)


def jsonable(value: Any) -> Any:
    """Dataclasses, enums and datetimes as plain JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """JSON on stdout, unstyled, so it pipes into jq."""
    print(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


def when(at: datetime | None) -> str:
    """A time as the tables show it, to the millisecond ("" for none)."""
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if at else ""


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, markup: bool = True) -> Table:
    """A table whose cells are Rich markup, or with `markup=False` plain text (data: paths, commit subjects, names,
    error messages; `[x]` in them must print as is). Callers that keep markup escape the data they put in.
    Nothing in the title or a cell a terminal would act on is printed (`terminal_safe`; in markup, its text only);
    cells that are not strings are data, never markup."""
    safe_title = safe_markup(title, "table.title") if markup else escape(terminal_safe(title))
    out = Table(title=safe_title, title_justify="left", header_style="bold")
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*(_cell(cell, markup) for cell in row))
    return out


def _cell(cell: Any, markup: bool) -> str | Text:
    if cell is None:
        return ""
    if not isinstance(cell, str):
        text = terminal_safe(str(cell))
        return escape(text) if markup else Text(text)
    return safe_markup(cell) if markup else Text(terminal_safe(cell))


def tasks_table(tasks: list[Task], title: str = "Tasks") -> Table:
    """One row per task, and a `labels` column as soon as one listed task has labels."""
    labelled = any(t.labels for t in tasks)
    columns = ["id", "pri", "status", "plan", "blocked by", *(["labels"] if labelled else []), "title"]
    rows = (
        [t.id, t.priority, t.status.value, t.plan_id, ", ".join(t.blockers),
         *([escape(", ".join(t.labels))] if labelled else []), escape(t.title)]
        for t in tasks
    )  # fmt: skip
    return table(title, columns, rows)


def session_json(session: Session) -> dict[str, Any]:
    """A session as JSON, with `escalated_at` (a verification the sweeper escalated; see Session.escalated_at)."""
    return {**jsonable(session), "escalated_at": jsonable(session.escalated_at)}


def sessions_table(sessions: list[Session], title: str = "Sessions") -> Table:
    """One row per session, and an `escalated` column (when the sweeper escalated the verification) as soon as
    one listed session is escalated: the table stays as narrow as it was when nothing waits too long."""
    escalated = any(s.escalated_at for s in sessions)
    columns = ["id", "task", "state", "prior", "version", "operator", "updated"] + (["escalated"] if escalated else [])
    rows = []
    for s in sessions:
        prior = s.prior_state.value if s.prior_state else ""
        row = [s.id, s.task_id, s.state.value, prior, s.version, escape(s.operator_id or ""), when(s.updated_at)]
        if escalated:
            row.append(f"[bold red]{when(s.escalated_at)}[/bold red]" if s.escalated_at else "")
        rows.append(row)
    return table(title, columns, rows)


def _notes(record: TransitionRecord) -> str:
    """The reason, then failed guards in full, or a count of passed ones."""
    failed = [g for g in record.guard_results if not g.get("passed")]
    notes = [escape(record.reason)] if record.reason else []
    notes += [f"[red]✗ {g['policy']}[/red]: {escape(str(g['message']))}" for g in failed]
    if record.guard_results and not failed:
        notes.append(f"[green]✓[/green] {len(record.guard_results)} guard(s)")
    return "; ".join(notes)


def _move(record: TransitionRecord) -> str:
    if record.outcome == Outcome.BLOCKED:
        return f"{record.from_state} [red]✗ blocked[/red]"
    return f"{record.from_state or '∅'} → {record.to_state}"


def transitions_table(records: list[TransitionRecord], title: str = "Transition log") -> Table:
    rows = (
        [
            r.seq,
            r.at.strftime("%H:%M:%S.%f")[:-3],
            r.session_id[:8],
            r.trigger,
            _move(r),
            r.session_version,
            escape(r.actor),
            _notes(r),
        ]
        for r in records
    )
    return table(title, ["seq", "at (UTC)", "session", "trigger", "from → to", "ver", "actor", "notes"], rows)


TRANSITION_FIELDS = [
    "seq",
    "at",
    "session_id",
    "trigger",
    "from_state",
    "to_state",
    "outcome",
    "session_version",
    "actor",
    "reason",
    "guard_results",
]


def transitions_csv(records: list[TransitionRecord]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TRANSITION_FIELDS)
    for r in records:
        data = jsonable(r)
        writer.writerow([json.dumps(data[f]) if f == "guard_results" else data[f] for f in TRANSITION_FIELDS])
    return buffer.getvalue()


def review_table(review: WorkspaceContext) -> Table:
    """A session's review: files changed, then commits, then the worktree's state."""
    title = (
        f"{review.branch}: {review.ahead} ahead / {review.behind} behind {review.base_ref} "
        f"(base {review.base_commit[:8]}, head {review.head_commit[:8]})"
    )
    rows = [(f.path, "binary" if f.added < 0 else f"+{f.added}", "" if f.deleted < 0 else f"-{f.deleted}")
            for f in review.diff_stat]  # fmt: skip
    rows += [(f"commit {c.sha[:8]}", c.author, c.subject) for c in review.commits]
    rows += [(name, "dirty", "") for name in review.dirty] + [(name, "untracked", "") for name in review.untracked]
    rows += [(name, "CONFLICT", "") for name in review.conflicts]
    return table(title, ["file / commit", "change", ""], rows, markup=False)


def worktrees_table(rows: list[WorktreeRow]) -> Table:
    return table(
        "Session worktrees",
        ["project", "session", "state", "branch", "disk", "path", "note"],
        [
            (r.project, (r.session_id or "-")[:8], r.state or "-", r.branch or "-", _size(r.bytes), r.path,
             "missing" if r.missing else ("orphan" if r.orphan else ""))
            for r in rows
        ],
        markup=False,
    )  # fmt: skip


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def context_panel(context: ProjectContext) -> Table:
    git, tracker = context.git, context.tracker
    rows: list[tuple[str, str]] = []
    if "error" in git:
        rows.append(("git", git["error"]))
    else:
        rows += [
            ("branch", f"{git['branch'] or '(detached)'} at {(git['head'] or '-')[:8]}"),
            ("working tree", f"{'clean' if git['clean'] else 'dirty'}; {git['staged']} staged, {git['unstaged']} "
             f"unstaged, {git['untracked']} untracked, {git['conflicted']} conflicted; {git['state']}"),
            ("worktrees", str(len(git["worktrees"]))),
        ]  # fmt: skip
        rows += [("commit", f"{c['sha'][:8]} {c['subject']}") for c in git["recent_commits"][:5]]
    rows.append(("tasks", f"{tracker['open']} open, {tracker['ready']} ready, {tracker['blocked']} blocked, "
                          f"{tracker['in_progress']} in progress, {tracker['total']} in all"))  # fmt: skip
    plan = tracker.get("current_plan")
    if plan:
        rows.append(("current plan", f"{plan['name']}: {plan['done']}/{plan['total']} done ({plan['percent']}%)"))
    age = f"{context.age_seconds:.1f}s old" + (" (cached)" if context.cached else "")
    return table(f"Context of {context.project_name} ({age})", ["", ""], rows, markup=False)


def operators_table(operators: list[Operator]) -> Table:
    return table(
        "Operators",
        ["id", "name", "roles", "permissions (effective)", "max active"],
        [
            (o.id, o.name, ", ".join(o.roles), ", ".join(sorted(p.value for p in effective_permissions(o))),
             o.max_active_sessions)
            for o in operators
        ],
        markup=False,
    )  # fmt: skip


def policies_table(project: str | None, entries: Sequence[PolicyEntry], test_command: Sequence[str]) -> Table:
    """`taskgate policies list`."""
    where = f"project {project}" if project else "global configuration"
    tests = f"; test_command: {' '.join(test_command)}" if test_command else "; no test_command"
    rows = []
    for entry in entries:
        d = entry.as_dict()
        settings = ", ".join(f"{k}={v}" for k, v in d["settings"].items())
        rows.append([d["name"], d["priority"], d["severity"], ", ".join(d["triggers"]),
                     "yes" if d["enabled"] else "no", settings, d["description"]])  # fmt: skip
    columns = ["policy", "priority", "severity", "triggers", "enabled", "settings", "description"]
    return table(f"Policies ({where}{tests})", columns, rows, markup=False)


def policy_check_data(check: PolicyCheck) -> dict[str, Any]:
    """`taskgate policies check --json`: the dry run as plain data."""
    run, slow = check.slow.test_run, check.slow
    return {
        "session_id": check.session.id,
        "trigger": check.trigger,
        "from_state": check.session.state.value,
        "to_state": check.to_state,
        "allowed": check.allowed,
        "policies": list(check.policies),
        "guard_results": [r.as_dict() for r in check.verdict.results],
        "bypassed": [v.as_dict() for v in check.verdict.bypassed],
        "test_run": None if run is None else _test_run_data(run, slow.test_run_reused),
        "test_note": slow.test_note,
    }


def _test_run_data(run: TestRun, reused: bool | None) -> dict[str, Any]:
    return {**jsonable(run), "reused": bool(reused), "stored": run.id is not None}


_MARKS = {"error": "[red]✗[/red]", "warning": "[yellow]![/yellow]", "info": "[blue]i[/blue]"}


def print_policy_check(check: PolicyCheck) -> None:
    """`taskgate policies check`: one line per policy, then the test run."""
    verdict = "[green]would be allowed[/green]" if check.allowed else "[red]would be refused[/red]"
    console.print(f"'{check.trigger}' on session {check.session.id[:8]} ({check.session.state.value} → "
                  f"{check.to_state}) {verdict}", highlight=False)  # fmt: skip
    if not check.policies:
        console.print("  no policy applies to this transition", highlight=False)
    for result in check.verdict.results:
        mark = "[green]✓[/green]" if result.passed else _MARKS.get(result.severity, "?")
        extra = " [yellow](overridden)[/yellow]" if result.overridden else ""
        console.print(f"  {mark} {escape(result.policy)} ({result.severity}){extra}", highlight=False)
        if result.message:
            console.print(f"      {result.message}", highlight=False, markup=False)
        if result.suggestion:
            console.print(f"      suggestion: {result.suggestion}", highlight=False, markup=False)
    run = check.slow.test_run
    if run is not None:
        how = "a stored run was reused" if check.slow.test_run_reused else "ran now (a dry run does not store it)"
        console.print(f"  tests: exit {run.exit_code}, {run.duration_ms} ms on {(run.head_commit or '?')[:12]}; {how}",
                      highlight=False)  # fmt: skip
    elif check.slow.test_note:
        console.print(f"  tests: {check.slow.test_note}", highlight=False, markup=False)


# the start of an escape sequence cut by the end of what was read so far (held back until the rest arrives)
_CUT_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[PX^_][^\x1b]*\x1b?|[ -/]*)\Z")
_ESC = re.compile("\x1b")
_HOLD_AT_MOST = 4096


class TerminalSafeStream:
    """`terminal_safe` over a byte stream read in pieces: UTF-8 and escape sequences cut between two reads are
    put back together before they are judged."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def feed(self, data: bytes, *, final: bool = False) -> str:
        text = self._held + self._decoder.decode(data, final=final)
        self._held = ""
        if not final:  # the earliest escape in the last few KB that has not ended yet waits for the next read
            window = max(0, len(text) - _HOLD_AT_MOST)
            cut = next((m.start() for m in _ESC.finditer(text, window) if _CUT_ESCAPE.match(text, m.start())), None)
            if cut is not None:
                text, self._held = text[:cut], text[cut:]
        return terminal_safe(text)


def workflows_table(entries: Sequence[Any]) -> Table:
    """`workflow list`: the catalogue's workflows (CatalogueEntry), valid or not."""
    rows = [(e.category or "", e.id, escape(e.description), e.steps, "yes" if e.valid else "[red]no[/red]", e.source,
             escape(e.file)) for e in entries]  # fmt: skip
    return table("Workflows", ["category", "id", "description", "steps", "valid", "source", "file"], rows)


def _step_what(step: Any) -> str:
    kind = step.type.value
    if kind == "agent":
        return f"{step.agent}" + (f" (input: {step.input})" if step.input else "")
    if kind == "approval":
        return step.message or ""
    if kind == "parallel":
        least = f"; min_success {step.min_success}" if step.min_success else ""
        return ", ".join(a.agent for a in step.agents) + least
    if kind == "condition":
        return step.when or ""
    if kind == "checklist":
        return step.checklist or f"{len(step.items)} inline item(s)"
    if kind == "workflow":
        return step.workflow or ""
    return f"{len(step.steps)} step(s), context {step.context_mode.value}" + (", summarized" if step.summarize else "")


def workflow_table(workflow: Any) -> Table:
    """`workflow show`: the steps in order (group members indented) with their routes."""
    from taskgate.domain.workflows.definitions import step_routes

    rows: list[tuple[Any, ...]] = []

    def add(steps: Sequence[Any], depth: int) -> None:
        for i, step in enumerate(steps):
            following = steps[i + 1].id if i + 1 < len(steps) else "end"
            routes = ", ".join(f"{label} → {target}" for label, target in step_routes(step, following, steps))
            retry = f"{step.max_retries}×" if step.max_retries else ""
            rows.append(("  " * depth + step.id, step.type.value, escape(_step_what(step)), routes, retry))
            add(step.steps, depth + 1)

    add(workflow.steps, 0)
    limits = f"max_iterations {workflow.max_iterations}"
    if workflow.max_duration_s:
        limits += f", max_duration {workflow.max_duration_s:g}s"
    title = f"{workflow.id} ({workflow.category or 'no category'}): {escape(workflow.description)}\n{limits}"
    if workflow.triggers:
        title += f"; triggers: {escape(', '.join(workflow.triggers))}"
    return table(title, ["step", "type", "what", "routes", "retries"], rows)


def checklists_table(checklists: Sequence[Any], origin: Callable[[str], str]) -> Table:
    """`checklist list`: id, description, items, where each comes from (`origin(file)`: built-in or project)."""
    rows = [(c.id, escape(c.description), len(c.items), sum(i.required for i in c.items), origin(c.file),
             escape(c.file)) for c in checklists]  # fmt: skip
    return table("Checklists", ["id", "description", "items", "required", "source", "file"], rows)


def checklist_table(checklist: Any) -> Table:
    rows = [(i.id, escape(i.text), "yes" if i.required else "no") for i in checklist.items]
    return table(f"{checklist.id}: {escape(checklist.description)}", ["item", "text", "required"], rows)


# -- running workflows ---------------------------------------------------------------------------------------

_MARKS = {"running": "▶", "waiting": "⏸", "succeeded": "✓", "approved": "✓", "failed": "✗", "rejected": "✗",
          "changes_requested": "↺", "skipped": "»", "cancelled": "■"}  # fmt: skip
_OPEN = frozenset({"running", "waiting"})


def first_line(text: str | None, width: int = 100) -> str:
    """The first non-blank line of `text`, stripped, cut to `width` with an ellipsis."""
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def step_run_line(run: StepRun, *, started: bool = False) -> str:
    """One line for a step run as it starts or ends (plain text: outputs are data, never Rich markup);
    `started`: the start of a run that has ended since."""
    status = "running" if started else run.status.value
    where = f"{'  ' * (run.depth - 1)}{_MARKS.get(status, '·')} {run.frame} › {run.step_id}"
    if run.attempt > 1:
        where += f" (attempt {run.attempt})"
    if status == "running":
        agents = f" ({len(run.agent_ids)} agent(s))" if run.agent_ids else ""
        return f"{where} running{agents}"
    if status == "waiting":
        return f"{where} waits for a person"
    note = first_line(run.error if status == "failed" and run.error else run.output_summary)
    return f"{where} {status.replace('_', ' ')}" + (f": {note}" if note else "")


def step_marks(runs: Sequence[StepRun]) -> dict[int, str]:
    """What `follow_steps` has already seen: run id → status (and whether its agents were noted)."""
    return {r.id: f"{r.status.value}:{bool(r.agent_ids)}" for r in runs if r.id is not None}


async def follow_steps(
    app: Any, session_id: str, *, until: Awaitable[Any], known: dict[int, str] | None = None, interval: float = 0.2
) -> None:
    """Print each step run of the session as it starts and ends, polling the database until `until` completes
    (and once more after). Runs already in `known` (see `step_marks`) are printed only when they change."""
    import asyncio  # not at the top: the read commands' fast path prints without the event loop

    done = asyncio.ensure_future(until)
    seen = dict(known or {})
    while True:
        finished = done.done()
        # what happened since the last poll, in the order it happened; a nested step and the step that ran it can
        # end in one transaction (one time): the inner one is printed first, as it ended first
        lines: list[tuple[datetime, int, str]] = []
        for run in await app.workflows.step_runs(session_id):
            mark = f"{run.status.value}:{bool(run.agent_ids)}"
            before = seen.get(run.id) if run.id is not None else None
            if run.id is None or before == mark:
                continue
            seen[run.id] = mark
            if before is not None and before.split(":")[0] == run.status.value == "running":
                continue  # only its agents were noted
            if before is None and run.agent_ids and run.status.value not in _OPEN:  # it started and ended unseen
                lines.append((run.started_at, run.depth, step_run_line(run, started=True)))
            ended = run.status.value not in _OPEN
            lines.append((run.ended_at or run.started_at, -run.depth if ended else run.depth, step_run_line(run)))
        for _, _, line in sorted(lines, key=lambda entry: entry[:2]):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        if finished:
            break
        await asyncio.wait({done}, timeout=interval)
    await done


def step_runs_table(runs: Sequence[StepRun], title: str = "Step runs") -> Table:
    """`workflow steps`: every step attempt of a session, oldest first."""
    rows = [(r.id, r.depth, escape(r.frame), escape(r.step_id), r.attempt, r.status.value, when(r.started_at),
             when(r.ended_at), " ".join(a[:8] for a in r.agent_ids),
             escape(first_line(r.error if r.error else r.output_summary, 60)))
            for r in runs]  # fmt: skip
    columns = ["run", "depth", "frame", "step", "attempt", "status", "started", "ended", "agents", "output / error"]
    return table(title, columns, rows)


def continue_hints(session_id: str, view: Any) -> list[str]:
    """The exact commands that let a paused workflow go on."""
    waiting = view.waiting
    if waiting is None:
        return []
    if waiting.kind == "approval":
        at = f"--expected-version {view.version}"  # sent twice, it is still one decision on this step
        return [f"taskgate session decide {session_id} approve {at}",
                f"taskgate session decide {session_id} request_changes {at} --instructions 'what to change'",
                f"taskgate session decide {session_id} reject {at} --reason 'why'"]  # fmt: skip
    return [f"taskgate checklist check {session_id} {item}" for item in waiting.missing]


def read_hint(session_id: str, view: Any) -> str | None:
    """The command that prints what an approval asks the operator to read (the output of the step before it)."""
    waiting = view.waiting
    if waiting is None or waiting.kind != "approval" or not waiting.output_of:
        return None
    return f"taskgate session output {session_id} --step {waiting.output_of}"


def waiting_lines(view: Any) -> list[str]:
    """What the session's workflow waits for, in words (plain text)."""
    waiting = view.waiting
    if waiting is None:
        return []
    if waiting.kind == "approval":
        return [f"waits for approval at step '{waiting.step_id}': {waiting.message}"]
    where = f"step '{waiting.step_id}' ({waiting.message})" if waiting.step_id else f"checklist {waiting.message}"
    ticked = [f"  [{' ' if i['id'] in waiting.missing else 'x'}] {i['id']}: {i['text']}"
              + ("" if i.get("required", True) else " (optional)") for i in waiting.items]  # fmt: skip
    if not waiting.missing:
        return [f"{where}: every required item is ticked", *ticked]
    return [f"waits for checklist {where}: tick {', '.join(waiting.missing)}", *ticked]


def print_workflow_status(session: Session, view: Any) -> None:
    """`session status`: state, and the workflow's depth, breadcrumb and what it waits for."""
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(f"session {session.id} ({session.task_id}) is {session.state.value}, version {session.version}")
    if not view.depth:
        say("workflow: none")
        return
    say(f"workflow: depth {view.depth}: {view.breadcrumb}")
    for line in waiting_lines(view):
        say(line)
    if read := read_hint(session.id, view):
        say(f"  read: {read}")
    for hint in continue_hints(session.id, view):
        say(f"  continue: {hint}")


def print_workflow_outcome(session: Session, view: Any, reason: str | None = None) -> bool:
    """The end of a foreground run: finished, paused (with the commands to continue), failed (with the reason),
    or where it stands. Returns False when the session failed."""
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    sid, state = session.id, session.state.value
    if state == "failed":
        first, *rest = (reason or f"see taskgate session history {sid}").strip().splitlines() or [""]
        say(f"failed: session {sid} is failed: {first}")
        for line in rest[:10]:
            say(f"    {line}")
        say(f"  try again: taskgate session fire {sid} retry")
        return False
    if state in ("ready", "planning") and view.depth:
        say(f"session {sid} is {state} with workflow {view.breadcrumb}")
        for line in waiting_lines(view):
            say(f"  {line}")
        nxt = f"session execute {sid}" if state == "planning" else f"session fire {sid} start"
        say(f"  run it: taskgate {nxt}")
        return True
    if view.waiting is not None:
        say(f"paused: session {sid} ({state}) at {view.breadcrumb}")
        for line in waiting_lines(view):
            say(f"  {line}")
        if read := read_hint(sid, view):
            say(f"  read: {read}")
        if state == "executing":
            for hint in continue_hints(sid, view):
                say(f"  continue: {hint}")
        return True
    if state == "verifying" and not view.depth:
        say(f"finished: the workflow is done and session {sid} is verifying")
        say(f"  decide: taskgate session decide {sid} approve | request_changes | reject")
        return True
    if state == "executing" and view.depth:
        say(f"running: session {sid} at {view.breadcrumb}; its agents run on, and `taskgate serve` moves it on")
        say(f"  follow: taskgate workflow steps {sid}")
        return True
    say(f"session {sid} is {state}" + (f" at {view.breadcrumb}" if view.depth else ""))
    return True


def sandbox_lines(events: list[dict], per_kind: int = 4) -> list[str]:
    """What the sandbox refused a session's agents, for `session status`: a count by kind, then the latest few of
    each kind (a breach first: it must never happen)."""
    if not events:
        return []
    by_what: dict[str, list[dict]] = {}
    counts: dict[str, int] = {}
    for event in events:
        what = "BREACH" if event["kind"] == "sandbox.breach" else str(event["payload"].get("what", "?"))
        by_what.setdefault(what, []).append(event["payload"])
        counts[what] = counts.get(what, 0) + int(event["payload"].get("count", 1))
    summary = ", ".join(f"{what} {n}" for what, n in sorted(counts.items()))
    lines = [f"sandbox refused: {summary} (all: session status --json)"]
    for what in sorted(by_what, key=lambda w: (w != "BREACH", w)):
        for p in by_what[what][-per_kind:]:
            if what != "more":
                lines.append(f"  {str(p.get('agent', ''))[:8]} {what} {p.get('target', '')} ({p.get('source', '')})")
    return lines


def pull_request_line(record: Any) -> str:
    """A session's pull request in one line: `#12 URL: checks_failed; CI failed (lint): sent back, round 1 of 3`."""
    if record is None:
        return ""
    where = f"#{record.number} {record.url}" if record.number is not None else f"not opened yet ({record.branch})"
    tail = f"; {record.note}" if record.note else ""
    error = f"; error: {record.error}" if record.error else ""
    return f"{where}: {record.status}{tail}{error}"


def pull_request_json(record: Any) -> dict[str, Any] | None:
    """A session's pull request row as JSON (without the forge's raw look), or None."""
    if record is None:
        return None
    keys = ("number", "url", "branch", "base", "pushed", "pushed_at", "status", "observed_at", "note", "error")
    return {key: jsonable(getattr(record, key)) for key in keys}


def question_json(question: Question) -> dict:
    """A question as --json shows it."""
    return jsonable(question) | {"kind": question.kind.value, "status": question.status.value,
                                 "choices": list(question.choices)}  # fmt: skip


def question_line(question: Question) -> str:
    """`q-1a2b3c (session 1a2b3c4d, until 10:30:00Z): Which colour? [red / blue]`"""
    until = question.deadline.strftime("%H:%M:%SZ")
    return f"{question.id} (session {question.session_id[:8]}, until {until}): {question.describe()}"


def emit(value: object, as_json: bool, as_table: Callable[[], object]) -> None:
    """Print `value` as JSON, or the renderable `as_table()` builds."""
    if as_json:
        print_json(value)
    else:
        console.print(as_table())
