"""What several benchmark scripts need alike (they run as `python benchmarks/NAME.py`, so this imports as
`bench_support`)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_repo(root: Path) -> Path:
    """A fresh git repository at `root/repo` with one empty commit on `main`, as a user's repository would be."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.name", "Bench"],
        ["config", "user.email", "bench@example.invalid"],
        ["commit", "-q", "--allow-empty", "-m", "init"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo
