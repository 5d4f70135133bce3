"""What `serve` over stdio found when it last opened its database: the local operator's grants (roles and
permissions), and the three settings its front needs to answer before the database is open.

Why: `serve` over stdio lists its tools before its database is open (entrypoints/mcp/front.py), filtered by the
local operator's grants. On SQLite it reads them with `sqlite3` (sqlite_roster.py); on PostgreSQL nothing can read
them that fast (asyncpg and SQLAlchemy take longer to import than an MCP client waits for the list), so the front
lists what these remembered grants allow and corrects itself once the database is open. With the operator's id, the
tool-name style and the SQLite file remembered too, the front needs no settings loaded (pydantic-settings and the
settings' models, ~55 ms): they load in the opening, behind the answers.

Keyed as settings_cache.py keys its entries (the folder, the config file's path and content, every `TASKGATE_*`
variable), so another configuration, database or operator is another entry. An entry holds the operator's id, its
roles and permissions, the tool-name style and the SQLite file's URL when the database is one; never a PostgreSQL
URL or a password (the key is a hash). Entries are written whole (write, then rename), so a reader never sees half
of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from taskgate.domain.errors import TaskgateError
from taskgate.infrastructure import settings_cache
from taskgate.infrastructure.sqlite_roster import CannotTell, sqlite_file

Grants = tuple[list[str], list[str]]
"""An operator's stored (roles, permissions), as sqlite_roster.operator_grants reads them."""

_FORMAT = 2  # raise when an entry changes shape: older entries then miss


@dataclass(frozen=True)
class Remembered:
    """What the last opening of serve's full server found for this configuration."""

    operator_id: str
    tool_names: str
    roster_url: str | None
    """The SQLite database's URL (sqlite_roster reads it); None for any other database, whose URL is not kept."""
    grants: Grants | None
    """The operator's (roles, permissions); None when it was not registered."""


def roster_url(database_url: str) -> str | None:
    """`database_url` when sqlite_roster can read it (a SQLite file: no password in it), else None."""
    try:
        sqlite_file(database_url)
    except CannotTell:
        return None
    return database_url


class RememberedGrants:
    """The entry of the configuration a command in `cwd` (default: the current folder) loads."""

    def __init__(self, cwd: Path | None = None) -> None:
        self._cwd = cwd

    def recall(self) -> Remembered | None:
        """What the last opening remembered for this configuration; None when nothing is (or it cannot be read:
        the caller then loads the settings and waits for the database)."""
        try:
            entry = json.loads(self._path().read_text())
            if entry.pop("format", None) != _FORMAT:
                return None
            grants = entry["grants"]
            if grants is not None:
                roles, permissions = grants
                grants = ([str(r) for r in roles], [str(p) for p in permissions])
            remembered = Remembered(**(entry | {"grants": grants}))
            if remembered.tool_names not in ("underscore", "colon") or not isinstance(remembered.operator_id, str):
                return None
            settings_cache.touch(self._path())  # in use: not pruned
            return remembered
        except (OSError, ValueError, TypeError, KeyError, AttributeError, TaskgateError):
            return None

    def remember(self, found: Remembered) -> None:
        """Write down what an opening found. Best effort: an entry that cannot be written only means the next serve
        loads its settings first and, on PostgreSQL, waits for its database to list its tools."""
        if found.roster_url is not None and roster_url(found.roster_url) is None:
            return  # never a URL that is not a SQLite file's (a password may be in it)
        grants = None if found.grants is None else [sorted(found.grants[0]), sorted(found.grants[1])]
        try:
            path = self._path()
            text = json.dumps({"format": _FORMAT} | asdict(found) | {"grants": grants})
            if path.is_file() and path.read_text() == text:
                return  # unchanged: every serve comes here
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
            temporary.write_text(text)
            os.chmod(temporary, 0o600)  # it names the user's operator and, on SQLite, database file
            temporary.replace(path)  # atomic: a reader sees the old entry or the whole new one
        except (OSError, ValueError, TaskgateError):
            return
        settings_cache.prune(path.parent, _FORMAT)  # older formats and configurations unused for a month

    def forget(self) -> None:
        """Remove the entry (it no longer says what this configuration loads). Best effort."""
        try:
            self._path().unlink(missing_ok=True)
        except (OSError, TaskgateError):
            return

    def _path(self) -> Path:
        """Raises: InvalidInput when TASKGATE_CONFIG names a missing file (settings_cache.key)."""
        return cache_dir() / f"{settings_cache.key(self._cwd)}.json"


def cache_dir() -> Path:
    """`grants` beside the settings cache: `$XDG_CACHE_HOME/taskgate/grants`, else `~/.cache/taskgate/grants`."""
    return settings_cache.cache_dir().with_name("grants")
