"""The local operator's grants (roles and permissions), remembered from the last time `serve` opened its database.

Why: `serve` over stdio lists its tools before its database is open (entrypoints/mcp/front.py), filtered by the
local operator's grants. On SQLite it reads them with `sqlite3` (sqlite_roster.py); on PostgreSQL nothing can read
them that fast (asyncpg and SQLAlchemy take longer to import than an MCP client waits for the list), so the front
lists what these remembered grants allow and corrects itself once the database is open.

Keyed as settings_cache.py keys its entries (the folder, the config file's path and content, every `TASKGATE_*`
variable), plus the operator's id: another configuration, database or operator is another entry. An entry holds
the roles and permissions only, never the database URL or its password (the key is a hash). Entries are written
whole (write, then rename), so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from taskgate.domain.errors import TaskgateError
from taskgate.infrastructure import settings_cache

Grants = tuple[list[str], list[str]]
"""An operator's stored (roles, permissions), as sqlite_roster.operator_grants reads them."""

_FORMAT = 1  # raise when an entry changes shape: older entries then miss


@dataclass(frozen=True)
class Remembered:
    """What the last opening found: the operator's grants, or None when it was not registered."""

    grants: Grants | None


class RememberedGrants:
    """The remembered grants of operator `operator_id` under the configuration a command in `cwd` loads."""

    def __init__(self, operator_id: str, cwd: Path | None = None) -> None:
        self._operator_id, self._cwd = operator_id, cwd

    def recall(self) -> Remembered | None:
        """The grants remembered for this operator and configuration; None when there are none (or they cannot be
        read: the caller then waits for the database)."""
        try:
            entry = json.loads(self._path().read_text())
            if entry.get("format") != _FORMAT or entry.get("operator") != self._operator_id:
                return None
            grants = entry["grants"]
            if grants is None:
                return Remembered(None)
            roles, permissions = grants
            return Remembered(([str(r) for r in roles], [str(p) for p in permissions]))
        except (OSError, ValueError, TypeError, KeyError, AttributeError, TaskgateError):
            return None

    def remember(self, grants: Grants | None) -> None:
        """Write down `grants` (None: not registered) as the opened database has them. Best effort: an entry that
        cannot be written only means the next serve on PostgreSQL waits for its database to list its tools."""
        entry = {"format": _FORMAT, "operator": self._operator_id,
                 "grants": None if grants is None else [sorted(grants[0]), sorted(grants[1])]}  # fmt: skip
        try:
            path = self._path()
            text = json.dumps(entry)
            if path.is_file() and path.read_text() == text:
                return  # unchanged: every serve comes here
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
            temporary.write_text(text)
            temporary.replace(path)  # atomic: a reader sees the old entry or the whole new one
        except (OSError, ValueError, TaskgateError):
            return

    def _path(self) -> Path:
        """Raises: InvalidInput when TASKGATE_CONFIG names a missing file (settings_cache.key)."""
        seen = f"{settings_cache.key(self._cwd)}\0{self._operator_id}".encode()
        return cache_dir() / f"{hashlib.sha256(seen).hexdigest()[:32]}.json"


def cache_dir() -> Path:
    """`grants` beside the settings cache: `$XDG_CACHE_HOME/taskgate/grants`, else `~/.cache/taskgate/grants`."""
    return settings_cache.cache_dir().with_name("grants")
