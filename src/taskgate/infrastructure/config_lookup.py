"""Which config file a command reads, found without loading the settings' models (pydantic).

`settings.py` loads and checks the file; this module only finds it, so that the engine-free read path
(`quick_reads.py`) can tell whether the settings it remembered (`settings_cache.py`) still hold.
"""

from __future__ import annotations

import os
from pathlib import Path

from taskgate.domain.errors import InvalidInput

DEFAULT_CONFIG = Path("config") / "taskgate.toml"
PROJECT_CONFIG = Path(".taskgate") / "taskgate.toml"  # what `taskgate init` writes into a repository
PROJECT_DATA_DIR = Path(".taskgate") / "data"  # the default data dir beside it (ignored by git: .taskgate/.gitignore)


def find_config_file(cwd: Path | None = None) -> Path | None:
    """`TASKGATE_CONFIG` if set (it must exist), else `.taskgate/taskgate.toml` in `cwd` or the nearest folder
    above it, else `config/taskgate.toml` in `cwd`; None when there is none.

    Raises: InvalidInput when TASKGATE_CONFIG names a missing file.
    """
    explicit = os.environ.get("TASKGATE_CONFIG")
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not path.is_file():
            raise InvalidInput(f"TASKGATE_CONFIG={explicit} does not exist")
        return path
    start = (cwd or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / PROJECT_CONFIG).is_file():
            return folder / PROJECT_CONFIG
        if folder == start and (start / DEFAULT_CONFIG).is_file():
            return start / DEFAULT_CONFIG
    return None


def config_base(path: Path | None, cwd: Path | None = None) -> Path:
    """The folder relative paths of a config file resolve against: the one holding `.taskgate/` or `config/` (the
    repository's root), else the file's own folder; the current folder when no file was loaded."""
    if path is None:
        return cwd or Path.cwd()
    return path.parent.parent if path.parent.name in ("config", ".taskgate") else path.parent
