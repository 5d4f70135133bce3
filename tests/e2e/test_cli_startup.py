"""What the real `taskgate` console script loads at start: commands that open no database load neither SQLAlchemy,
Alembic nor the MCP SDK, the top-level help not even Typer; a database already at the schema head is opened
without Alembic. Each run is `python -X importtime .venv/bin/taskgate ...`, which names every module it imports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
DATABASE_AND_MCP = {"sqlalchemy", "alembic", "mcp"}
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", re.M)


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")}
    return env | {"TASKGATE_DATA_DIR": str(workdir / "data"), "COLUMNS": "120"}


def _loads(workdir: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the console script with `args`; what it did, and the top-level packages it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", TASKGATE, *args],
        cwd=workdir,
        env=_env(workdir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = set(_IMPORTED.findall(done.stderr))
    assert "taskgate.entrypoints.cli" in modules, done.stderr[-2000:]  # the parse found the import lines
    return done, {name.split(".")[0] for name in modules}


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--config", "elsewhere.toml", "--help"]])
def test_the_top_level_help_loads_no_typer_no_database_and_no_mcp(tmp_path, args):
    done, loaded = _loads(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage: taskgate [OPTIONS] COMMAND [ARGS]..." in done.stdout
    assert "  fsm        The session state machine" in done.stdout
    assert loaded.isdisjoint(DATABASE_AND_MCP | {"typer", "click", "rich", "pydantic"}), loaded


def test_taskgate_alone_prints_the_help_on_stderr_and_exits_2_as_typer_did(tmp_path):
    done, loaded = _loads(tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Usage: taskgate [OPTIONS] COMMAND [ARGS]...\n\n  taskgate: run AI coding agents" in done.stderr
    assert "typer" not in loaded


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["fsm"], "Session transitions"),
        (["fsm", "--format", "mermaid"], "stateDiagram-v2"),
        (["workflow", "validate"], "ok: "),
        (["workflow", "--help"], "Usage: taskgate workflow"),
        (["session", "--help"], "Usage: taskgate session"),
        (["fsm", "-h"], "Usage: taskgate fsm"),
    ],
)
def test_commands_that_open_no_database_load_neither_sqlalchemy_alembic_nor_mcp(tmp_path, args, says):
    done, loaded = _loads(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert says in done.stdout
    assert "typer" in loaded  # the command ran through the Typer app
    assert loaded.isdisjoint(DATABASE_AND_MCP), loaded & DATABASE_AND_MCP
    assert not (tmp_path / "data").exists()  # nor created a database


def test_a_database_at_the_schema_head_is_opened_without_alembic(tmp_path):
    first, loaded = _loads(tmp_path, "project", "list", "--json")  # a new database: migrated, by Alembic
    assert first.returncode == 0, first.stderr[-2000:]
    assert {"sqlalchemy", "alembic"} <= loaded
    again, loaded = _loads(tmp_path, "project", "list", "--json")  # at head: one SELECT of alembic_version
    assert again.returncode == 0, again.stderr[-2000:]
    assert "sqlalchemy" in loaded
    assert "alembic" not in loaded


def test_a_command_that_opens_taskgate_and_launches_no_agent_loads_neither_the_mcp_sdk_nor_uvicorn(tmp_path):
    """Every command that opens taskgate gives the agents it may launch an MCP endpoint; the SDK and uvicorn load
    when the first agent needs it (~0.45 s of a command's ~1.3 s before), not for `session show` or `task add`."""
    assert _loads(tmp_path, "project", "list")[0].returncode == 0  # migrated once, so the runs below are at head
    for args in (["project", "list", "--json"], ["operator", "list"]):
        done, loaded = _loads(tmp_path, *args)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "sqlalchemy" in loaded
        assert loaded.isdisjoint({"mcp", "uvicorn", "starlette"}), (args, loaded & {"mcp", "uvicorn", "starlette"})


def test_an_unknown_command_is_named_by_typer_with_every_command_loaded(tmp_path):
    done, _ = _loads(tmp_path, "sesion")
    assert done.returncode == 2
    assert "No such command 'sesion'" in done.stderr


def test_python_dash_m_taskgate_is_the_same_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "taskgate", "fsm", "--format", "mermaid"], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("stateDiagram-v2") and "created --> initializing: initialize" in done.stdout
    helped = subprocess.run([sys.executable, "-m", "taskgate", "--help"], cwd=tmp_path, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "Usage: taskgate [OPTIONS] COMMAND [ARGS]..." in helped.stdout
