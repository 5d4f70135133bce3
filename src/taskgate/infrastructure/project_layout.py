"""What `taskgate init` writes into a repository: the `.taskgate/` folder.

    .taskgate/taskgate.toml     the configuration (commented; commit it)
    .taskgate/.gitignore        keeps data/ out of git
    .taskgate/README.md         what the folder holds
    .taskgate/workflows/        the team's own workflows (<category>/<id>.yaml), over the built-in catalogue
    .taskgate/checklists/       the team's own checklists
    .taskgate/agents/           the team's agent scripts (`{config_dir}/agents/…` in an agent command)
    .taskgate/data/             the database and session folders (ignored by git; created on first use)

Files are created only when missing (`open(..., "x")`), never rewritten, so running init again changes nothing
and a file the team edited is kept. Nothing is written outside a git repository's working tree.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.config_lookup import PROJECT_CONFIG
from taskgate.infrastructure.workflow_files import BUILTIN_CATALOGUE

FOLDER = PROJECT_CONFIG.parent
_TEMPLATE = BUILTIN_CATALOGUE / "project-taskgate.toml"
_README = """\
# taskgate

This folder is taskgate's set-up of this repository (`taskgate init` wrote it; commit it).

- `taskgate.toml`: the configuration. `taskgate info` shows every path in use, `taskgate doctor` checks the set-up.
- `workflows/<category>/<id>.yaml`, `checklists/<id>.yaml`: the team's own workflows and checklists. They add to
  the built-in ones (`taskgate workflow list` shows where each comes from); one with a built-in id replaces it.
- `agents/`: scripts for agent types of your own (`{config_dir}/agents/<script>` in an `[agents.NAME]` command).
- `data/`: the database and the session folders. Not tracked (see `.gitignore`).
"""


@dataclass
class Layout:
    """What `set_up` found and did: the repository root, files and folders created, and those already there."""

    root: Path
    created: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def config_file(self) -> Path:
        return self.root / PROJECT_CONFIG


def repository_root(path: Path) -> Path:
    """The root of the git working tree holding `path`.

    Raises: InvalidInput when `path` does not exist, git is missing, or it is not inside a git working tree.
    """
    if not path.is_dir():
        raise InvalidInput(f"{path} is not a folder")
    try:
        found = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        raise InvalidInput("git is not installed (or not on PATH); taskgate needs it") from None
    if found.returncode != 0 or not found.stdout.strip():
        raise InvalidInput(f"{path.resolve()} is not inside a git repository (run `git init` there first)")
    return Path(found.stdout.strip()).resolve()


def current_branch(root: Path) -> str | None:
    """The branch checked out at `root` (None when HEAD is detached or git cannot tell)."""
    found = subprocess.run(["git", "-C", str(root), "symbolic-ref", "--quiet", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    return found.stdout.strip() or None if found.returncode == 0 else None


def has_layout(root: Path) -> bool:
    """Whether `root` holds `.taskgate/taskgate.toml`."""
    return (root / PROJECT_CONFIG).is_file()


def set_up(root: Path) -> Layout:
    """Create what is missing of `.taskgate/` under the repository `root`; keep what exists. The config's
    `base_branch` is the branch checked out now (`main` when none is)."""
    layout = Layout(root)
    folder = root / FOLDER
    for sub in ("", "workflows", "checklists", "agents"):
        target = folder / sub
        (layout.kept if target.is_dir() else layout.created).append(f"{FOLDER / sub}/")
        target.mkdir(parents=True, exist_ok=True)
    config = _TEMPLATE.read_text(encoding="utf-8")
    branch = current_branch(root) or "main"
    config = config.replace('base_branch = "main"', f'base_branch = "{_toml_text(branch)}"')
    files = {
        PROJECT_CONFIG: config,
        FOLDER / ".gitignore": "# taskgate's database and session folders stay out of git\ndata/\n",
        FOLDER / "README.md": _README,
        FOLDER / "workflows" / ".gitkeep": "",
        FOLDER / "checklists" / ".gitkeep": "",
        FOLDER / "agents" / ".gitkeep": "",
    }
    for relative, text in files.items():
        (layout.created if _create(root / relative, text) else layout.kept).append(str(relative))
    return layout


def _create(path: Path, text: str) -> bool:
    """Write `path` unless it exists (atomically refused by "x"); True when this call created it."""
    try:
        with open(path, "x", encoding="utf-8") as out:
            out.write(text)
    except FileExistsError:
        return False
    return True


def _toml_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
