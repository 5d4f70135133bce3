"""The session folder on a real disk: every escape attempt refused with nothing written outside, the happy
paths, the manifest under concurrent writers, and `save_output` over MCP as an agent and as an operator."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskgate.application.agents.outputs import OUTPUT_SAVED_EVENT, SaveOutput
from taskgate.domain.access import Principal
from taskgate.domain.errors import Forbidden, InvalidInput, SessionNotFound, TaskgateError
from taskgate.domain.outputs import OutputLimits
from taskgate.infrastructure import session_folder
from taskgate.infrastructure.session_folder import SessionFolderStore
from tests.builders import fire, seed, start
from tests.conftest import make_git_repo, wire
from tests.mcp.conftest import connect

SID = "6f1c0000-0000-4000-8000-000000000001"
OTHER = "6f1c0000-0000-4000-8000-000000000002"
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TASK = {"id": "T-1", "title": "work"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "agent-outputs"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.fixture
def store(root: Path) -> SessionFolderStore:
    return SessionFolderStore(root)


def folder(root: Path, sid: str = SID) -> Path:
    path = root / sid
    path.mkdir(parents=True, exist_ok=True)
    return path


def files_under(path: Path) -> list[str]:
    """Every non-directory entry under `path` (symlinks included, not followed)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_symlink() or not p.is_dir())


async def save(store: SessionFolderStore, path: str, data: bytes = b"pwned\n", sid: str = SID):
    return await store.write_output(sid, path, data, at=AT, by="agent:t", task=TASK)


# -- the corpus of escape attempts ---------------------------------------------------------------------------------

Setup = Callable[[Path, Path], None]  # (session folder, outside dir) -> plant something


def nothing(_: Path, __: Path) -> None:
    pass


def link_dir(name: str, target: Callable[[Path, Path], str | Path]) -> Setup:
    def plant(f: Path, out: Path) -> None:
        (f / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target(f, out), f / name)

    return plant


def make_fifo(f: Path, _: Path) -> None:
    os.mkfifo(f / "fifo")


def make_dir(f: Path, _: Path) -> None:
    (f / "dir").mkdir()


def make_file(f: Path, _: Path) -> None:
    (f / "file").write_text("a file\n")


TEXT_ATTEMPTS = [
    "..",
    "../",
    "../x",
    "../../x",
    "a/../../x",
    "a/b/../../../x",
    "./x",
    "/etc/passwd",
    "/tmp/taskgate-escape",
    "//x",
    "///etc/passwd",
    "file:///etc/passwd",
    "\x00",
    "x\x00/../../etc/passwd",
    "C:\\x",
    "C:x",
    "a\\..\\b",
    "..\\..\\x",
    "~/.ssh/x",
    "~root/x",
    ".ssh/authorized_keys",
    ".git/hooks/pre-commit",
    "-rf",
    "x" * 300,
    "/".join(["a"] * 40),
    "\u202eexe.txt",
    "\uff0e\uff0e/x",
    "..\uff0fx",
    "\u2024\u2024/x",  # ONE DOT LEADER twice: NFKC makes it '..'
    "a\u200b/../../x",
    " ../x",
    "\n../x",
    "\ud800/x",
    "manifest.json",
    "Manifest.JSON",
    "",
]

PLANTED: dict[str, tuple[Setup, str]] = {
    "symlinked dir to outside": (link_dir("link", lambda f, o: o), "link/x"),
    "symlinked dir, deeper": (link_dir("a/b", lambda f, o: o), "a/b/c/x"),
    "the symlink itself as the file": (link_dir("link", lambda f, o: o), "link"),
    "symlinked file to outside": (link_dir("notes.md", lambda f, o: o / "notes.md"), "notes.md"),
    "relative symlink to the parent": (link_dir("up", lambda f, o: ".."), f"up/{OTHER}/x"),
    "symlink to the folder's parent, absolute": (link_dir("parent", lambda f, o: f.parent), "parent/x"),
    "symlink to /": (link_dir("slash", lambda f, o: "/"), "slash/tmp/taskgate-escape"),
    "symlink loop": (link_dir("loop", lambda f, o: "loop"), "loop/x"),
    "dangling symlink into outside": (link_dir("d", lambda f, o: o / "new"), "d/x"),
    "a FIFO in the way": (make_fifo, "fifo"),
    "a folder in the way": (make_dir, "dir"),
    "a file in the way of a folder": (make_file, "file/x"),
}


@pytest.mark.parametrize("path", TEXT_ATTEMPTS, ids=[repr(p)[:24] for p in TEXT_ATTEMPTS])
async def test_paths_that_could_escape_are_refused_and_nothing_is_written(store, root, outside, path):
    folder(root)
    with pytest.raises(InvalidInput):
        await save(store, path)
    assert files_under(outside) == [] and files_under(root) == []


@pytest.mark.parametrize("case", list(PLANTED))
async def test_symlinks_and_special_files_planted_in_the_folder_are_never_written_through(store, root, outside, case):
    setup, path = PLANTED[case]
    planted = folder(root)
    setup(planted, outside)
    before = files_under(planted)
    with pytest.raises((Forbidden, InvalidInput)) as refused:
        await save(store, path)
    assert files_under(outside) == [], f"{case}: something was written outside"
    assert files_under(planted) == before, f"{case}: the folder changed"
    assert not (root / OTHER).exists()
    if "symlink" in case:
        assert "symbolic link" in str(refused.value)


def test_the_corpus_has_at_least_thirty_attempts():
    assert len(TEXT_ATTEMPTS) + len(PLANTED) + 3 >= 30  # + the three tests below


async def test_a_symlinked_session_folder_is_refused(store, root, outside):
    root.mkdir()
    os.symlink(outside, root / SID)
    with pytest.raises(Forbidden, match="symbolic link"):
        await save(store, "x")
    assert files_under(outside) == []


async def test_a_hard_link_at_the_name_is_replaced_not_written_through(store, root, outside):
    victim = outside / "victim.db"
    victim.write_bytes(b"precious")
    os.link(victim, folder(root) / "hard")
    await save(store, "hard", b"new")
    assert victim.read_bytes() == b"precious" and (root / SID / "hard").read_bytes() == b"new"


async def test_a_folder_moved_out_during_the_write_is_detected_and_nothing_lands_outside(
    store, root, outside, monkeypatch
):
    (folder(root) / "a").mkdir()
    real_write = session_folder._write_all

    def move_then_write(fd: int, data: bytes) -> None:
        os.rename(root / SID / "a", outside / "a")  # the attacker's move, mid-write
        real_write(fd, data)

    monkeypatch.setattr(session_folder, "_write_all", move_then_write)
    with pytest.raises(Forbidden, match="moved or replaced"):
        await save(store, "a/x")
    assert files_under(outside) == []


async def test_a_symlink_swapped_in_and_out_while_writing_never_lets_a_write_out(store, root, outside):
    planted = folder(root)
    stop = threading.Event()

    def flip() -> None:  # the writer creates "race" too, so every step may lose a race of its own
        race = planted / "race"
        while not stop.is_set():
            with suppress(OSError):
                shutil.rmtree(race)
            with suppress(OSError):
                os.symlink(outside, race)
            time.sleep(0.0005)
            with suppress(OSError):
                race.unlink()
            with suppress(OSError):
                race.mkdir()

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        for _ in range(300):
            try:
                await save(store, "race/x")
                outcomes["ok"] += 1
            except (Forbidden, InvalidInput, TaskgateError):
                outcomes["refused"] += 1
    finally:
        stop.set()
        flipper.join()
    assert files_under(outside) == []
    assert outcomes["refused"] > 0


# -- the happy paths -----------------------------------------------------------------------------------------------


async def test_nested_folders_are_created_and_the_manifest_lists_each_output(store, root):
    record = await save(store, "reports/unit/tests.txt", b"12 passed\n")
    assert (root / SID / "reports" / "unit" / "tests.txt").read_bytes() == b"12 passed\n"
    assert record.sha256 == hashlib.sha256(b"12 passed\n").hexdigest() and record.bytes == 10
    manifest = json.loads((root / SID / "manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["session"] == SID and manifest["task"] == TASK
    assert manifest["outputs"] == [record.to_dict()] and manifest["status"] == "open"
    assert await store.read_manifest(SID) == manifest
    assert files_under(root / SID) == ["manifest.json", "reports/unit/tests.txt"]  # no temporary files left


async def test_saving_a_path_again_replaces_the_file_and_its_record(store, root):
    await save(store, "notes.md", b"first, longer\n")
    await save(store, "notes.md", b"second\n")
    assert (root / SID / "notes.md").read_bytes() == b"second\n"
    outputs = (await store.read_manifest(SID))["outputs"]
    assert [(o["path"], o["bytes"]) for o in outputs] == [("notes.md", 7)]


async def test_binary_content_is_written_byte_for_byte(store, root):
    data = bytes(range(256)) * 4
    await save(store, "bin/blob.dat", data)
    assert (root / SID / "bin" / "blob.dat").read_bytes() == data


async def test_limits_are_enforced_with_a_clear_error(root):
    store = SessionFolderStore(root, OutputLimits(max_output_bytes=8, max_outputs=2, max_session_bytes=12))
    with pytest.raises(InvalidInput, match="limit is 8 bytes per output"):
        await save(store, "big", b"x" * 9)
    await save(store, "a", b"x" * 8)
    with pytest.raises(InvalidInput, match="per session"):
        await save(store, "b", b"x" * 5)
    await save(store, "b", b"x" * 4)
    with pytest.raises(InvalidInput, match="limit is 2"):
        await save(store, "c", b"x")
    assert files_under(root / SID) == ["a", "b", "manifest.json"]


async def test_a_corrupt_manifest_is_kept_aside_and_a_symlinked_one_is_replaced_not_followed(store, root, outside):
    planted = folder(root)
    (planted / "manifest.json").write_text("{not json")
    assert await store.read_manifest(SID) is None
    await save(store, "a", b"1")
    assert (planted / "manifest.json.corrupt").read_text() == "{not json"
    target = outside / "etc-passwd"
    target.write_text("root:x:0:0\n")
    (planted / "manifest.json").unlink()
    os.symlink(target, planted / "manifest.json")
    assert await store.read_manifest(SID) is None
    await store.update_manifest(SID, lambda m: {**m, "status": "running"})
    assert target.read_text() == "root:x:0:0\n" and not (planted / "manifest.json").is_symlink()


async def test_twenty_concurrent_writers_and_two_processes_worth_of_stores_list_every_output(root):
    first, second = SessionFolderStore(root), SessionFolderStore(root)  # separate asyncio locks: flock must hold

    async def writer(i: int) -> None:
        await save(first if i % 2 else second, f"out/{i:02d}.txt", f"output {i}\n".encode())

    async def agents(i: int) -> None:
        await (first if i % 2 else second).update_manifest(
            SID, lambda m: {**m, "agents": [*m["agents"], {"id": f"agent-{i}"}]}
        )

    await asyncio.gather(*(writer(i) for i in range(20)), *(agents(i) for i in range(6)))
    manifest = json.loads((root / SID / "manifest.json").read_text())
    assert sorted(o["path"] for o in manifest["outputs"]) == [f"out/{i:02d}.txt" for i in range(20)]
    assert sorted(a["id"] for a in manifest["agents"]) == sorted(f"agent-{i}" for i in range(6))
    assert not [n for n in os.listdir(root / SID) if n.endswith(".tmp")]


async def test_bad_session_ids_never_become_folder_names(store, root):
    for bad in ["..", "../x", "x", SID.upper(), f"{SID}/..", ""]:
        with pytest.raises(InvalidInput, match="not a UUID"):
            await save(store, "x", sid=bad)
    assert not root.exists() or files_under(root) == []


# -- the use cases and the MCP tool ---------------------------------------------------------------------------------


@pytest.fixture
async def seeded(services, tmp_path, root):
    services = wire(services.backend, services.database, services.url, outputs_root=root)
    made = await seed(services, make_git_repo(tmp_path / "repo"), tasks=2)
    sessions = [await start(services, task) for task in made.tasks]
    return services, sessions


async def test_save_output_writes_lists_and_logs_an_event(seeded, root):
    services, (session, _) = seeded
    data = base64.b64encode(b"\x00\x01binary").decode()
    record = await services.outputs.save_output(SaveOutput(session.id, "bin/x.dat", data, "base64", "agent:t"))
    assert (root / session.id / "bin" / "x.dat").read_bytes() == b"\x00\x01binary"
    manifest = await services.outputs.manifest(session.id)
    assert manifest["outputs"] == [record.to_dict()] and manifest["task"]["id"] == session.task_id
    async with services.uow(write=False) as uow:
        events = [e for e in await uow.events.list(session.id) if e["kind"] == OUTPUT_SAVED_EVENT]
    assert [e["payload"]["path"] for e in events] == ["bin/x.dat"]


async def test_save_output_refuses_unknown_and_finished_sessions_and_bad_content(seeded, root):
    services, (session, _) = seeded
    with pytest.raises(SessionNotFound):
        await services.outputs.save_output(SaveOutput(OTHER, "x", "y"))
    for content, encoding, message in [("%%%", "base64", "not valid base64"), ("x", "rot13", "unknown")]:
        with pytest.raises(InvalidInput, match=message):
            await services.outputs.save_output(SaveOutput(session.id, "x", content, encoding))  # type: ignore[arg-type]
    cancelled = await fire(services, session, "cancel")
    with pytest.raises(InvalidInput, match="cancelled"):
        await services.outputs.save_output(SaveOutput(cancelled.id, "x", "y"))
    assert not (root / session.id / "x").exists()


async def test_the_supervisor_records_agents_inputs_status_and_times(seeded, root):
    services, (session, _) = seeded
    path = await services.outputs.open_folder(session.id)
    assert path == str(root / session.id) == services.outputs.folder(session.id)
    await services.outputs.record_inputs(session.id, {"prompt": "do it", "instructions": None})
    await services.outputs.record_agents(session.id, [{"id": "a1", "name": "coder", "status": "running"}],
                                         status="running", started_at=AT)  # fmt: skip
    done = await services.outputs.record_agents(session.id, [{"id": "a1", "status": "succeeded", "exit_code": 0}],
                                                status="completed", completed_at=AT)  # fmt: skip
    assert done["agents"] == [{"id": "a1", "name": "coder", "status": "succeeded", "exit_code": 0}]
    assert (done["status"], done["started_at"], done["completed_at"]) == ("completed", AT.isoformat(), AT.isoformat())
    assert done["inputs"] == {"prompt": "do it", "instructions": None}
    assert json.loads((root / session.id / "manifest.json").read_text()) == done


async def test_an_agent_saves_into_its_own_session_only(seeded, root):
    services, (own, other) = seeded
    async with connect(services, Principal.agent("tok-1", own.id)) as tools:
        out = await tools.ok("save_output", session_id=own.id, path="reports/review.md", content="LGTM\n")
        assert out["path"] == "reports/review.md" and out["by"] == "agent:tok-1" and out["session_id"] == own.id
        refused = await tools.refused("save_output", session_id=other.id, path="x.md", content="sneaky")
        assert "scoped to session" in refused
        escape = await tools.refused("save_output", session_id=own.id, path="../x.md", content="sneaky")
        assert "InvalidInput" in escape and "'..' component" in escape
        nul = await tools.refused("save_output", session_id=own.id, path="a.md", content="a\x00b")
        assert "NUL" in nul
    assert (root / own.id / "reports" / "review.md").read_text() == "LGTM\n"
    assert not (root / other.id).exists() and not (root / "x.md").exists()


async def test_an_operator_saves_into_any_session(seeded, root):
    services, (_, other) = seeded
    async with connect(services, Principal.operator("alice")) as tools:
        out = await tools.ok(
            "save_output", session_id=other.id[:8], path="notes.txt", content="aGk=", encoding="base64"
        )
    assert out["bytes"] == 2 and (root / other.id / "notes.txt").read_bytes() == b"hi"


async def test_has_manifest_answers_from_a_stat_and_follows_the_recorded_place(store, root):
    """The cheap check a transition's manifest effect makes: no folder, no manifest; a written one (at its
    recorded place too) is seen; read_manifest stays the judge of what is there."""
    assert not store.has_manifest(SID)  # no root, no folder
    await save(store, "x")
    assert store.has_manifest(SID) and await store.read_manifest(SID) is not None
    placed = "6f1c0000-0000-4000-8000-000000000003"
    await store.place(placed, f"runs/{placed}")
    assert not store.has_manifest(placed)
    await store.update_manifest(placed, lambda m: m)
    assert (root / "runs" / placed / "manifest.json").is_file() and not (root / placed).exists()
    assert store.has_manifest(placed)
    assert not store.has_manifest(OTHER)


async def test_a_folder_holding_only_the_worktree_hooks_log_moves_to_a_workflows_place(store, root):
    """The after_create hook writes hooks.log when the worktree is made, before a workflow (attached after the start)
    places the folder: the log moves along; a folder holding anything else is still refused."""
    await store.ensure(SID)
    (root / SID / "hooks.log").write_text("=== after_create …\n")
    assert await store.place(SID, f"runs/2026/{SID}") == str(root / "runs" / "2026" / SID)
    assert (root / "runs" / "2026" / SID / "hooks.log").read_text() == "=== after_create …\n"
    assert not (root / SID).exists() and store.path(SID) == str(root / "runs" / "2026" / SID)
    await store.ensure(OTHER)
    (root / OTHER / "hooks.log").write_text("log\n")
    (root / OTHER / "notes.txt").write_text("an output\n")
    with pytest.raises(InvalidInput, match="folder exists already"):
        await store.place(OTHER, f"runs/{OTHER}")
    assert (root / OTHER / "notes.txt").exists() and store.path(OTHER) == str(root / OTHER)
