"""Spend caps (pure): budgets in tokens and US dollars per session, task, project and day (optionally per preset),
what a session's start reserves, and when a cap is nearly spent or reached.

Configuration (`[budgets]`, and a project's `[projects.<name>.budgets]` over it key by key):

    [budgets]
    session = {tokens = 200000, usd = 2.0}
    task = {usd = 5.0}
    project = {usd = 100.0}
    day = {usd = 20.0}                        # one project's spend on one UTC day
    per_preset.claude = {day = {usd = 10.0}}  # the same scopes, counting only that preset's agents
    expected = {tokens = 50000, usd = 1.0}    # what one session is expected to spend: its start reserves it
    warn_at = 0.8                             # `budget.nearly_spent` once spend crosses this share of a cap

Spend is what agents reported (`AgentReport`): tokens are input + output (cache reads are not counted), dollars the
reported cost (an agent whose CLI reports no cost, Codex, adds no dollars). A session *reserves* `expected` while it
is in progress (planning .. awaiting_merge) and none of its agents has ended, or one still runs: its reservation is
released, replaced by what its agents reported, once its agents have ended. A start is allowed when, for every cap
that applies to it, spent + reserved + expected stays within the cap (`refusals`); an agent is stopped once its
session's spend reaches a cap (`crossings`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from taskgate.domain.errors import InvalidInput

SCOPES = ("session", "task", "project", "day")
UNITS = ("tokens", "usd")
BUDGET_REACHED = "budget.reached"  # events other components subscribe to by name (notifications)
BUDGET_NEARLY_SPENT = "budget.nearly_spent"


@dataclass(frozen=True, slots=True)
class Amount:
    """Tokens and dollars."""

    tokens: int = 0
    usd: float = 0.0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.tokens + other.tokens, self.usd + other.usd)

    def of(self, unit: str) -> float:
        return self.tokens if unit == "tokens" else self.usd


NOTHING = Amount()


@dataclass(frozen=True, slots=True)
class Limit:
    """A cap in tokens, dollars, or both (None: not capped in that unit)."""

    tokens: int | None = None
    usd: float | None = None

    def of(self, unit: str) -> float | None:
        return self.tokens if unit == "tokens" else self.usd

    @property
    def set(self) -> bool:
        return self.tokens is not None or self.usd is not None


@dataclass(frozen=True, slots=True)
class Caps:
    """One cap per scope (unset: not capped)."""

    session: Limit = Limit()
    task: Limit = Limit()
    project: Limit = Limit()
    day: Limit = Limit()

    def of(self, scope: str) -> Limit:
        return getattr(self, scope)

    @property
    def set(self) -> bool:
        return any(self.of(scope).set for scope in SCOPES)


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """One project's budgets (the global `[budgets]` with its own table over it)."""

    caps: Caps = Caps()
    per_preset: Mapping[str, Caps] = field(default_factory=dict)
    expected: Amount = NOTHING
    warn_at: float = 0.8

    @property
    def set(self) -> bool:
        return self.caps.set or any(c.set for c in self.per_preset.values())


@dataclass(frozen=True, slots=True)
class Budgets:
    """Every project's budgets: the global table and the projects' own tables (merged key by key)."""

    default: BudgetConfig = BudgetConfig()
    projects: Mapping[str, BudgetConfig] = field(default_factory=dict)

    def of(self, project: str) -> BudgetConfig:
        return self.projects.get(project, self.default)

    @property
    def set(self) -> bool:
        return self.default.set or any(c.set for c in self.projects.values())


NO_BUDGETS = Budgets()


@dataclass(frozen=True, slots=True)
class Spent:
    """One agent's reported spend, with where it counts."""

    session_id: str
    task_id: str
    agent_type: str
    at: datetime | None  # when it ended (or started, while it runs): the day it counts for
    amount: Amount


@dataclass(frozen=True, slots=True)
class Subject:
    """The session a check is about: its id, its task and its project's name."""

    session_id: str
    task_id: str
    project: str


@dataclass(frozen=True, slots=True)
class Line:
    """One cap in one unit as it stands for a subject: `taskgate usage`'s budget rows and every check's input."""

    scope: str  # session | task | project | day, or "<preset> <scope>" for a preset's cap
    key: str  # the session id, task id, project name, or "<project> <YYYY-MM-DD>"
    unit: str  # tokens | usd
    spent: float
    reserved: float
    limit: float

    @property
    def share(self) -> float:
        return (self.spent + self.reserved) / self.limit

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "key": self.key, "unit": self.unit, "spent": self.spent,
                "reserved": self.reserved, "limit": self.limit, "used": round(self.share, 4)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Crossing:
    """A cap that spend reached (`reached`) or nearly reached (`nearly`, past `warn_at`)."""

    kind: str  # reached | nearly
    line: Line

    @property
    def event(self) -> str:
        return BUDGET_REACHED if self.kind == "reached" else BUDGET_NEARLY_SPENT

    def payload(self, session_id: str) -> dict[str, Any]:
        line = self.line
        return {"session_id": session_id, "scope": line.scope, "key": line.key, "spent": line.spent,
                "limit": line.limit, "unit": line.unit}  # fmt: skip

    def reason(self) -> str:
        return f"budget: {_scope_words(self.line)} spend {_money(self.line.unit, self.line.spent)} reached " \
               f"{_money(self.line.unit, self.line.limit)}"  # fmt: skip


def lines(
    config: BudgetConfig,
    subject: Subject,
    spent: Iterable[Spent],
    reserving: Iterable[tuple[str, str]],
    today: date,
    preset_of: Callable[[str], str] = str,
) -> list[Line]:
    """Every cap that applies to `subject`, with what was spent and reserved under it.

    `spent`: the agents of the subject's project; `reserving`: (session id, task id) of the project's sessions that
    hold a reservation (`holds_reservation`). A preset's caps count only that preset's agents (`preset_of(agent
    type)`), and no reservations.
    """
    spent, reserving = list(spent), list(reserving)
    keys = {"session": subject.session_id, "task": subject.task_id, "project": subject.project,
            "day": f"{subject.project} {today.isoformat()}"}  # fmt: skip

    def counts(scope: str, session_id: str, task_id: str, at: datetime | None) -> bool:
        if scope == "session":
            return session_id == subject.session_id
        if scope == "task":
            return task_id == subject.task_id
        return scope == "project" or at is None or at.date() == today

    found: list[Line] = []
    tables = [("", config.caps, None)] + [(f"{p} ", c, p) for p, c in sorted(config.per_preset.items())]
    for prefix, caps, preset in tables:
        for scope in SCOPES:
            limit = caps.of(scope)
            mine = [s.amount for s in spent if (preset is None or preset_of(s.agent_type) == preset)
                    and counts(scope, s.session_id, s.task_id, s.at)]  # fmt: skip
            held = 0 if preset is not None else sum(1 for sid, tid in reserving if counts(scope, sid, tid, None))
            total = sum(mine, NOTHING)
            for unit in UNITS:
                cap = limit.of(unit)
                if cap is not None:
                    reserved = held * config.expected.of(unit)
                    found.append(Line(prefix + scope, keys[scope], unit, total.of(unit), reserved, cap))
    return found


def refusals(config: BudgetConfig, caps: Iterable[Line]) -> list[str]:
    """Why a start cannot reserve `config.expected` under these caps (empty: it can). A preset's cap refuses only
    once it is spent (its agents' share of the expected spend is not known before they run)."""
    found = []
    for line in caps:
        expected = 0.0 if " " in line.scope else config.expected.of(line.unit)
        if line.spent + line.reserved + expected > line.limit or line.spent >= line.limit:
            held = f" + reserved {_money(line.unit, line.reserved)}" if line.reserved else ""
            found.append(f"budget: {_scope_words(line)} spend {_money(line.unit, line.spent)}{held} + expected "
                         f"{_money(line.unit, expected)} exceeds {_money(line.unit, line.limit)}")  # fmt: skip
    return found


def crossings(config: BudgetConfig, caps: Iterable[Line]) -> list[Crossing]:
    """The caps that spend (reservations aside) reached, or crossed `warn_at` of."""
    found = []
    for line in caps:
        if line.spent >= line.limit:
            found.append(Crossing("reached", line))
        elif line.spent >= config.warn_at * line.limit:
            found.append(Crossing("nearly", line))
    return found


def holds_reservation(in_progress: bool, agent_statuses: Iterable[str]) -> bool:
    """Whether a session holds its reservation: in progress, and no agent of it ended yet or one still runs."""
    statuses = list(agent_statuses)
    return in_progress and (not statuses or any(s in ("queued", "running") for s in statuses))


def _scope_words(line: Line) -> str:
    if line.scope.endswith("day"):
        project, _, day = line.key.rpartition(" ")
        return f"project {project} {line.scope.removesuffix('day')}day ({day})"
    return f"{line.scope} {line.key}"


def _money(unit: str, value: float) -> str:
    return f"${value:.2f}" if unit == "usd" else f"{int(value)} tokens"


# -- configuration ---------------------------------------------------------------------------------------------


def parse_budgets(table: Mapping[str, Any] | None, projects: Mapping[str, Mapping[str, Any] | None]) -> Budgets:
    """`[budgets]` and each `[projects.<name>.budgets]` (a project's keys over the global ones; its per_preset
    tables over the global per_preset tables preset by preset).

    Raises: InvalidInput naming the key: `budgets.day.usd: must be a positive number, not -1`.
    """
    default = parse_config(table or {}, "budgets")
    own = {}
    for name, override in projects.items():
        if override:
            merged = {**(table or {}), **override}
            if "per_preset" in override:
                merged["per_preset"] = {**(table or {}).get("per_preset", {}), **override["per_preset"]}
            own[name] = parse_config(merged, f"projects.{name}.budgets")
    return Budgets(default, own)


def parse_config(table: Mapping[str, Any], where: str) -> BudgetConfig:
    """One budgets table. Raises: InvalidInput naming the key."""
    _keys(table, (*SCOPES, "per_preset", "expected", "warn_at"), where)
    warn_at = table.get("warn_at", 0.8)
    if isinstance(warn_at, bool) or not isinstance(warn_at, int | float) or not 0 < warn_at <= 1:
        raise InvalidInput(f"{where}.warn_at: must be a number above 0 and at most 1, not {warn_at!r}")
    presets = table.get("per_preset", {})
    if not isinstance(presets, Mapping):
        raise InvalidInput(f"{where}.per_preset: must be a table of presets")
    per_preset = {}
    for preset, caps in presets.items():
        if not isinstance(caps, Mapping):
            raise InvalidInput(f"{where}.per_preset.{preset}: must be a table of scopes")
        _keys(caps, SCOPES, f"{where}.per_preset.{preset}")
        per_preset[preset] = _caps(caps, f"{where}.per_preset.{preset}")
    expected = _limit(table.get("expected", {}), f"{where}.expected")
    return BudgetConfig(_caps(table, where), per_preset, Amount(expected.tokens or 0, expected.usd or 0.0),
                        float(warn_at))  # fmt: skip


def _caps(table: Mapping[str, Any], where: str) -> Caps:
    return Caps(**{scope: _limit(table.get(scope, {}), f"{where}.{scope}") for scope in SCOPES})


def _limit(table: Any, where: str) -> Limit:
    if not isinstance(table, Mapping):
        raise InvalidInput(f"{where}: must be a table like {{tokens = 100000, usd = 5.0}}, not {table!r}")
    _keys(table, UNITS, where)
    for unit, value in table.items():
        number = int if unit == "tokens" else int | float
        if isinstance(value, bool) or not isinstance(value, number) or value <= 0:
            kind = "a positive whole number" if unit == "tokens" else "a positive number"
            raise InvalidInput(f"{where}.{unit}: must be {kind}, not {value!r}")
    usd = table.get("usd")
    return Limit(table.get("tokens"), float(usd) if usd is not None else None)


def _keys(table: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in known:
            raise InvalidInput(f"{where}.{key}: unknown key; {where} takes {', '.join(known)}")
