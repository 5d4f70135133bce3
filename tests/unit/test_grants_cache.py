"""What serve's last opening remembered (infrastructure/grants_cache.py): found again by the same configuration
only, and never a PostgreSQL URL (a password may be in it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from taskgate.infrastructure import settings_cache
from taskgate.infrastructure.grants_cache import Remembered, RememberedGrants, cache_dir, roster_url

PG = "postgresql+asyncpg://alice:s3cret@db.example:5432/taskgate"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in [n for n in os.environ if n.upper().startswith("TASKGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_what_an_opening_remembered_is_recalled_by_the_same_configuration() -> None:
    found = Remembered("alice", "colon", "sqlite:////tmp/x/taskgate.db", (["reviewer"], ["write"]))
    RememberedGrants().remember(found)
    assert RememberedGrants().recall() == found
    assert oct((next(cache_dir().glob("*.json"))).stat().st_mode & 0o777) == "0o600"


def test_another_taskgate_variable_or_folder_is_another_entry(tmp_path: Path, monkeypatch) -> None:
    RememberedGrants().remember(Remembered("alice", "underscore", None, None))
    assert RememberedGrants(tmp_path / "elsewhere").recall() is None
    monkeypatch.setenv("TASKGATE_OPERATOR__DEFAULT", "bob")
    assert RememberedGrants().recall() is None


def test_a_postgresql_url_is_never_written() -> None:
    assert roster_url(PG) is None and roster_url("sqlite:///data/taskgate.db") == "sqlite:///data/taskgate.db"
    RememberedGrants().remember(Remembered("alice", "underscore", PG, (["admin"], [])))
    assert RememberedGrants().recall() is None
    assert not cache_dir().exists() or "s3cret" not in "".join(p.read_text() for p in cache_dir().iterdir())


def test_a_forgotten_or_unreadable_entry_is_nothing_remembered() -> None:
    memory = RememberedGrants()
    memory.remember(Remembered("alice", "underscore", None, (["admin"], [])))
    memory.forget()
    assert memory.recall() is None
    cache_dir().mkdir(parents=True, exist_ok=True)
    memory.remember(Remembered("alice", "underscore", None, None))
    (entry,) = cache_dir().glob("*.json")
    entry.write_text('{"format": 2, "operator_id": "alice"}')  # half an entry (never written so: still not read)
    assert memory.recall() is None


def test_entries_unused_for_a_month_are_pruned_when_another_is_written(tmp_path: Path) -> None:
    RememberedGrants(tmp_path / "old").remember(Remembered("alice", "underscore", None, None))
    (old,) = cache_dir().glob("*.json")
    month_ago = time.time() - settings_cache.STALE_AFTER_S - 60
    os.utime(old, (month_ago, month_ago))
    RememberedGrants().remember(Remembered("bob", "underscore", None, None))
    assert not old.exists() and RememberedGrants().recall() is not None
