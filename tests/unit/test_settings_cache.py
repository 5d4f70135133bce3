"""The remembered settings (infrastructure/settings_cache.py): an entry is found only by the configuration it was
written for, is private to the user, and old or unused entries are pruned when another is written."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from taskgate.infrastructure import settings_cache


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in [n for n in os.environ if n.upper().startswith("TASKGATE_")]:
        monkeypatch.delenv(name)
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    return tmp_path / "cache" / "taskgate" / "settings"


def test_an_entry_is_recalled_only_by_its_configuration(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings_cache.remember({"database_url": "sqlite:///a.db"})
    assert settings_cache.recall() == {"database_url": "sqlite:///a.db"}
    [entry] = folder.glob("*.json")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    monkeypatch.setenv("taskgate_data_dir", "elsewhere")  # the settings read it whatever its case: a new key
    assert settings_cache.recall() is None


def test_older_formats_and_unused_entries_are_pruned_when_one_is_written(folder: Path) -> None:
    folder.mkdir(parents=True)
    old_format = folder / f"{'0' * 32}.json"  # format 1: the facts alone, a password in the URL
    old_format.write_text(json.dumps({"database_url": "postgresql://u:pw@h/d"}))
    unused = folder / f"{'1' * 32}.json"
    unused.write_text(json.dumps({"format": 2, "facts": {}}))
    month_ago = time.time() - settings_cache.STALE_AFTER_S - 60
    os.utime(unused, (month_ago, month_ago))
    kept = folder / f"{'2' * 32}.json"
    kept.write_text(json.dumps({"format": 2, "facts": {}}))
    settings_cache.remember({"database_url": "sqlite:///a.db"})
    assert not old_format.exists() and not unused.exists() and kept.exists()
    assert settings_cache.recall() == {"database_url": "sqlite:///a.db"}


def test_a_recalled_entry_is_kept_fresh(folder: Path) -> None:
    settings_cache.remember({"database_url": "sqlite:///a.db"})
    [entry] = folder.glob("*.json")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(entry, (two_days_ago, two_days_ago))
    assert settings_cache.recall() is not None
    assert time.time() - entry.stat().st_mtime < 60  # touched: a configuration in use is never pruned
