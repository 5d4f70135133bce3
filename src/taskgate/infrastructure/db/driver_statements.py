"""The hot statements of a transition, run on SQLite's driver directly, with SQLAlchemy's own conversions.

SQLAlchemy's execution path costs ~15–25 µs per statement here (execution context, events, result set-up),
while the sqlite3 call itself costs 2–5 µs; a transition sends 5–9 statements. So the statements of
`statements.HOT` are compiled once per set of parameter names and run on the sqlite3 cursor: the SQL string,
the positional order, the bind processors (JSON, UTC datetimes) and the result processors are SQLAlchemy's own,
taken from the compiled statement, so values are stored and read exactly as through `Connection.execute`.
A driver error is wrapped as SQLAlchemy wraps it (`DBAPIError.instance`), so callers catch the same
`IntegrityError` / `OperationalError`. PostgreSQL keeps SQLAlchemy's path (asyncpg prepares statements itself).

Only what the repositories use on these statements is offered: `.mappings().first()/.all()`, `.rowcount`,
`.inserted_primary_key`, `.scalar_one()`. Anything else is an AttributeError, never a silent difference.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import Executable


class _Prepared:
    """One statement compiled for one set of parameter names."""

    __slots__ = ("columns", "compiled", "direct", "expanded", "expanding", "order")

    def __init__(self, statement: Executable, dialect: Dialect, keys: Sequence[str]) -> None:
        compiled: Any = statement.compile(dialect=dialect, column_keys=list(keys))  # type: ignore[attr-defined]
        if getattr(compiled, "insert_prefetch", None) or getattr(compiled, "update_prefetch", None):
            raise ValueError(f"statement computes Python-side defaults; run it through SQLAlchemy: {compiled}")
        self.compiled = compiled
        processors = compiled._bind_processors
        self.order = tuple((key, processors.get(key)) for key in compiled.positiontup)
        # Every placeholder is a parameter the caller gives and none expands (IN lists): the positional
        # arguments come straight from the caller's dict. Otherwise SQLAlchemy fills in the statement's own
        # bound literals and renders the IN lists for their lengths.
        self.direct = not compiled.post_compile_params and set(compiled.positiontup) <= set(keys)
        # IN lists (expanding parameters) are rendered by SQLAlchemy for their lengths on every call, which cost
        # more than the statement (~50 µs for the guard facts' list of states): the rendering is kept per tuple of
        # lengths (`_Expansion`). Values rendered into the SQL itself (literal_execute) cannot be kept.
        self.expanding = tuple(p.key for p in compiled.post_compile_params if not p.literal_execute)
        if len(self.expanding) != len(compiled.post_compile_params):
            self.expanding = ()
        self.expanded: dict[tuple[int, ...], _Expansion] = {}
        self.columns = tuple(
            (entry.keyname, entry.type._cached_result_processor(dialect, None)) for entry in compiled._result_columns
        )

    def arguments(self, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL string and its positional arguments, converted by SQLAlchemy's bind processors."""
        if self.direct:
            return self.compiled.string, [p(params[k]) if p is not None else params[k] for k, p in self.order]
        if self.expanding:
            shape = tuple(len(params[key]) for key in self.expanding)
            expansion = self.expanded.get(shape)
            if expansion is None:
                expansion = self.expanded[shape] = _Expansion(self.compiled, params)
            return expansion.sql, expansion.arguments(params)
        full = self.compiled.construct_params(params)
        if not self.compiled.post_compile_params:
            return self.compiled.string, [_convert(self.compiled._bind_processors, full, k) for k, _ in self.order]
        state = self.compiled._process_parameters_for_postcompile(full)
        return state.statement, [_convert(state.processors, state.parameters, k) for k in state.positiontup]


class _Expansion:
    """A statement with IN lists rendered by SQLAlchemy for one tuple of list lengths, and where each of its
    positional arguments comes from: a parameter, an element of a list parameter, or a constant of the statement
    (one of its own bound literals, converted once)."""

    __slots__ = ("sources", "sql")

    def __init__(self, compiled: Any, params: Mapping[str, Any]) -> None:
        state = compiled._process_parameters_for_postcompile(compiled.construct_params(params))
        element_of = {
            name: (key, index) for key, names in state.parameter_expansion.items() for index, name in enumerate(names)
        }
        self.sql = state.statement
        # (kind, parameter, list index, bind processor), or (_CONSTANT, name, 0, the converted value)
        self.sources: list[tuple[int, str, int, Any]] = []
        for name in state.positiontup:
            process = state.processors.get(name)
            if name in element_of:
                self.sources.append((_ELEMENT, *element_of[name], process))
            elif name in params:
                self.sources.append((_PARAMETER, name, 0, process))
            else:
                self.sources.append((_CONSTANT, name, 0, _convert(state.processors, state.parameters, name)))

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for `params`, converted by SQLAlchemy's bind processors."""
        args = []
        for kind, key, index, process in self.sources:
            if kind == _CONSTANT:
                args.append(process)
                continue
            value = params[key][index] if kind == _ELEMENT else params[key]
            args.append(process(value) if process is not None else value)
        return args


_PARAMETER, _ELEMENT, _CONSTANT = range(3)


def _convert(processors: Mapping[str, Any], values: Mapping[str, Any], key: str) -> Any:
    process = processors.get(key)
    value = values[key]
    return process(value) if process is not None else value


def run_bare(dbapi_connection: sqlite3.Connection, statement: str) -> None:
    """A statement without parameters or rows (BEGIN, SAVEPOINT, RELEASE, ROLLBACK TO) on the sqlite3 connection:
    SQLAlchemy's execution path costs more than such a statement. Raises: SQLAlchemy's DBAPIError subclasses."""
    try:
        dbapi_connection.execute(statement)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(statement, (), exc, sqlite3.Error) from exc


class DriverResult:
    """What a hot statement returned: rows as dicts (already converted), or the write's counts."""

    __slots__ = ("_lastrowid", "_rows", "rowcount")

    def __init__(self, rows: list[dict[str, Any]], rowcount: int, lastrowid: int | None) -> None:
        self._rows, self.rowcount, self._lastrowid = rows, rowcount, lastrowid

    def mappings(self) -> DriverResult:
        return self

    def first(self) -> dict[str, Any] | None:
        return self._rows[0] if self._rows else None

    def all(self) -> list[dict[str, Any]]:
        return self._rows

    def scalar_one(self) -> Any:
        if len(self._rows) != 1:
            raise ValueError(f"expected one row, got {len(self._rows)}")
        return next(iter(self._rows[0].values()))

    @property
    def inserted_primary_key(self) -> tuple[int | None]:
        return (self._lastrowid,)


class DriverStatements:
    """The hot statements of one SQLite dialect, each compiled on first use per set of parameter names."""

    def __init__(self, dialect: Dialect, statements: Iterable[Executable]) -> None:
        self._dialect = dialect
        self._hot = {id(s): s for s in statements}
        self._prepared: dict[tuple[int, tuple[str, ...]], _Prepared] = {}

    def runs(self, statement: Any, params: Any) -> bool:
        """Whether `statement` with `params` (one dict of parameters) goes to the driver."""
        return id(statement) in self._hot and isinstance(params, dict)

    def execute(self, dbapi_connection: sqlite3.Connection, statement: Any, params: dict[str, Any]) -> DriverResult:
        """Run `statement` on the driver. Raises: SQLAlchemy's DBAPIError subclasses, as `execute` would."""
        keys = tuple(params)
        prepared = self._prepared.get((id(statement), keys))
        if prepared is None:
            prepared = self._prepared[(id(statement), keys)] = _Prepared(statement, self._dialect, keys)
        sql, args = prepared.arguments(params)
        try:
            cursor = dbapi_connection.execute(sql, args)
            rows = cursor.fetchall() if prepared.columns else []
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, args, exc, sqlite3.Error) from exc
        columns = prepared.columns
        converted = [
            {
                key: (process(value) if process is not None else value)
                for (key, process), value in zip(columns, row, strict=True)
            }
            for row in rows
        ]
        return DriverResult(converted, cursor.rowcount, cursor.lastrowid)
