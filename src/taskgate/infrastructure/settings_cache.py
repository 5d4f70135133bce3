"""What the engine-free read path needs of the settings, remembered from the last full start that loaded them.

Loading the settings (pydantic models, every check) costs more than a read command may take. So each command
that opened taskgate the full way writes down the few facts a read needs (the database, the SQLite busy timeout,
whether any tracker is read live), keyed by everything that decides the settings: the folder the command ran in,
the config file found from it (its path and content) and every `TASKGATE_*` variable. A
read command computes the same key from what it sees; only when an entry for that key exists (a full start has
loaded and checked exactly this configuration) does it skip loading the settings. Any change to the file or the
environment is a new key, so the next command takes the full path (which reports a bad configuration as ever)
and remembers the new facts. Entries are written whole (write, then rename), so a reader never sees half of one.

The folder is pruned whenever an entry is written: entries of an older format (format 1 held a PostgreSQL URL's
password; the facts now never do, quick_reads.facts_of) and entries not used for `STALE_AFTER_S` go. An entry is
touched when it is recalled, so one in use stays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from taskgate.domain.errors import TaskgateError
from taskgate.infrastructure.config_lookup import find_config_file

_FORMAT = 2  # raise when the facts change shape: older entries then miss, and are pruned
STALE_AFTER_S = 30 * 24 * 3600
"""An entry not recalled or written for this long is removed the next time any entry is written."""


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/taskgate/settings`, else `~/.cache/taskgate/settings`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "taskgate" / "settings"


def key(cwd: Path | None = None) -> str:
    """The key of the configuration a command in `cwd` (default: the current folder) would load.

    Raises: InvalidInput when TASKGATE_CONFIG names a missing file (as loading the settings would).
    """
    here = (cwd or Path.cwd()).resolve()
    path = find_config_file(here)
    seen = {
        "format": _FORMAT,
        "cwd": str(here),
        "config": str(path) if path else None,
        # the content, not its modification time: two writes within one clock tick of the file system keep it
        "file": hashlib.sha256(path.read_bytes()).hexdigest() if path else None,
        # any case: the settings read `taskgate_database_url` as they read TASKGATE_DATABASE_URL
        "env": sorted((name, value) for name, value in os.environ.items() if name.upper().startswith("TASKGATE_")),
    }
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:32]


def recall(cwd: Path | None = None) -> dict[str, Any] | None:
    """The facts remembered for the configuration a command in `cwd` would load; None when there are none (or
    they cannot be read: the caller then loads the settings)."""
    try:
        path = cache_dir() / f"{key(cwd)}.json"
        entry = json.loads(path.read_text())
    except (OSError, ValueError, TaskgateError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != _FORMAT:
        return None
    touch(path)
    return entry["facts"]


def touch(path: Path) -> None:
    """Mark the entry at `path` as in use (it is not pruned for STALE_AFTER_S), at most once a day: a read writes
    nothing else."""
    with contextlib.suppress(OSError):
        if time.time() - path.stat().st_mtime > STALE_AFTER_S / 30:
            os.utime(path)


def remember(facts: dict[str, Any], cwd: Path | None = None) -> None:
    """Write down `facts` for the configuration a command in `cwd` loaded. Best effort: a cache that cannot be
    written only means the next read command loads the settings again."""
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        name = key(cwd)
        text = json.dumps({"format": _FORMAT, "facts": facts})
        if (folder / f"{name}.json").is_file() and (folder / f"{name}.json").read_text() == text:
            return  # every command that opens taskgate comes here: unchanged facts are not written again
        temporary = folder / f".{name}.{os.getpid()}.tmp"
        temporary.write_text(text)
        os.chmod(temporary, 0o600)  # it names the user's databases and folders
        temporary.replace(folder / f"{name}.json")  # atomic: a reader sees the old entry or the whole new one
    except (OSError, ValueError, TaskgateError):
        return
    prune(folder, _FORMAT)


def prune(folder: Path, current: int) -> None:
    """Remove the entries in `folder` whose format is not `current`, or unused for STALE_AFTER_S (grants_cache.py
    prunes its own folder so too). Best effort: an entry that cannot be read or removed is left (a concurrent
    writer's temporary file is never touched)."""
    now = time.time()
    for path in folder.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            if now - path.stat().st_mtime > STALE_AFTER_S:
                path.unlink()
                continue
            entry = json.loads(path.read_text())
            if not isinstance(entry, dict) or entry.get("format") != current:
                path.unlink()
