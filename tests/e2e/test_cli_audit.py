"""The audit log's proofs through the real `taskgate` executable, as a user and an auditor run them (issue 21):
`init` makes the key, sessions move, `audit checkpoint`, `verify`, `export`, `verify --file` from an empty folder
on another "machine", a database, an export and a public key edited by hand, `prune`, `status`; and bad input,
each refused by name with exit 2 and nothing written."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from taskgate.infrastructure.audit.keys import create_key
from tests.e2e.test_cli import TASKGATE
from tests.e2e.test_init import User, fresh_repo, git, snapshot

KEY_DIR = Path(".taskgate", "data", "audit-key")


class Auditor(User):
    """A user of their own repository (no TASKGATE_* variables), who also checks exit codes."""

    def exits(self, code: int, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        done = self.run(*args, cwd=cwd)
        assert done.returncode == code, f"taskgate {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stdout + done.stderr
        return done

    def refuses(self, *args: str, cwd: Path | None = None) -> str:
        """A command given bad input: exit 2, one line on stderr, nothing on stdout."""
        done = self.exits(2, *args, cwd=cwd)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert done.stdout == ""
        return lines[0]

    @property
    def database(self) -> Path:
        return self.repo / ".taskgate" / "data" / "taskgate.db"

    @property
    def public_key(self) -> Path:
        return self.repo / KEY_DIR / "signing-key.pem.pub"

    def sql(self, statement: str, *params: object) -> list[tuple]:
        """One statement on the SQLite file, committed; the connection closed (its -wal and -shm go with it)."""
        with contextlib.closing(sqlite3.connect(self.database)) as conn, conn:
            return conn.execute(statement, params).fetchall()


@pytest.fixture
def auditor(tmp_path: Path) -> Auditor:
    return Auditor(fresh_repo(tmp_path / "shop"))


def busy(user: Auditor, sessions: int = 2) -> list[str]:
    """`sessions` tasks, each started and moved a few steps: transitions, events, a refused transition."""
    ids = []
    for n in range(1, sessions + 1):
        user.ok("task", "add", f"Task {n}")
        session = user.json("session", "start", f"SHOP-{n}")["id"]
        for trigger in ("plan_complete", "suspend"):
            user.ok("session", "fire", session[:8], trigger, "--reason", f"because {trigger}")
        ids.append(session)
    return ids


def second_transition(user: Auditor, session_id: str) -> int:
    rows = user.sql("SELECT seq FROM transition_log WHERE session_id = ? ORDER BY seq", session_id)
    return rows[1][0]


def test_init_prints_the_new_audit_key_and_keeps_it_out_of_git(auditor: Auditor):
    out = auditor.ok("init")
    line = auditor.public_key.read_text().strip()
    key_id = auditor.json("audit", "key")["key"]
    assert f"audit key {key_id} created" in out and line in out.splitlines()
    assert str(auditor.repo.resolve() / KEY_DIR / "signing-key.pem") in out and str(auditor.public_key.resolve()) in out
    assert "keep a copy of this public key with your auditors" in out
    assert "signed audit checkpoint #1" in out  # this very init's records, sealed at once
    assert (auditor.repo / KEY_DIR / "signing-key.pem").stat().st_mode & 0o777 == 0o600
    # the key never reaches git: .taskgate/ to commit, its data/ (and the key in it) ignored
    assert git(auditor.repo, "status", "--porcelain", "--untracked-files=all").count("audit-key") == 0
    assert git(auditor.repo, "check-ignore", str(KEY_DIR / "signing-key.pem")).strip()

    before = snapshot(auditor.repo / ".taskgate")
    again = auditor.ok("init")
    assert f"audit key {key_id} kept (it exists)" in again and line in again.splitlines()
    assert "already set up: nothing changed" in again and "checkpoint" not in again
    assert snapshot(auditor.repo / ".taskgate") == before


def test_a_key_file_configured_inside_the_repository_is_added_to_a_gitignore(auditor: Auditor):
    auditor.env["TASKGATE_AUDIT__KEY_FILE"] = str(auditor.repo / "secrets" / "audit.pem")
    out = auditor.ok("init")
    assert f"added the private key to {auditor.repo.resolve() / 'secrets' / '.gitignore'}" in out
    untracked = git(auditor.repo, "status", "--porcelain", "--untracked-files=all")
    assert "secrets/audit.pem.pub" in untracked and "secrets/audit.pem\n" not in untracked  # the public half may go
    assert auditor.ok("init").count(".gitignore") == 0  # ignored now: nothing added twice


def test_a_user_signs_verifies_exports_and_an_auditor_verifies_the_export_elsewhere(auditor: Auditor, tmp_path):
    auditor.ok("init")
    sessions = busy(auditor)
    assert "signed checkpoint #2" in auditor.ok("audit", "checkpoint")
    out = auditor.exits(0, "audit", "verify").stdout
    assert out.startswith("OK  audit log: nothing was changed")
    assert "not yet signed  0 record(s)" in out and "last checkpoint  #2" in out
    status = auditor.json("audit", "status")["last_checkpoint"]  # who asked is signed into the checkpoint
    operator = auditor.env.get("USER") or "operator"  # the CLI acts as the configured local operator
    assert (status["number"], status["reason"], status["by"]) == (2, "demand", f"operator:{operator}")
    report = auditor.json("audit", "verify")
    assert report["ok"] and report["records"] > 10 and report["checkpoints"] == 2 and report["findings"] == []
    one = auditor.json("audit", "verify", "--session", sessions[0][:8], "--since", "2000-01-01T00:00:00Z")
    assert one["ok"] and one["chains"] == 1 and one["scope"]["session"] == sessions[0]

    exported = tmp_path / "x.jsonl"
    done = auditor.exits(0, "audit", "export", "--format", "jsonl", "--output", str(exported))
    assert done.stdout == "" and "exported" in done.stderr and f"to {exported}" in done.stderr
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "end"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    # the auditor's machine: an empty folder, no config, no database; only the export and their copy of the key
    elsewhere = tmp_path / "auditor"
    elsewhere.mkdir()
    their_key = tmp_path / "auditors-copy.pub"
    their_key.write_text(auditor.public_key.read_text())
    out = auditor.exits(0, "audit", "verify", "--file", str(exported), "--public-key", str(their_key), cwd=elsewhere)
    assert out.stdout.startswith(f"OK  {exported}: nothing was changed")
    assert list(elsewhere.iterdir()) == []  # no database, no .taskgate, nothing

    # to stdout: the same export, line for line but for the header's time
    piped = auditor.exits(0, "audit", "export").stdout.splitlines()
    assert piped[1:] == exported.read_text().splitlines()[1:]


def test_edits_by_hand_are_named_in_the_database_in_an_export_and_by_a_replaced_public_key(auditor, tmp_path):
    auditor.ok("init")
    sessions = busy(auditor)
    auditor.ok("audit", "checkpoint")
    exported = tmp_path / "x.jsonl"
    auditor.ok("audit", "export", "--output", str(exported))
    their_key = tmp_path / "auditors-copy.pub"
    their_key.write_text(auditor.public_key.read_text())

    seq = second_transition(auditor, sessions[1])
    [(actor,)] = auditor.sql("SELECT actor FROM transition_log WHERE seq = ?", seq)
    auditor.sql("UPDATE transition_log SET actor = 'operator:mallory' WHERE seq = ?", seq)
    done = auditor.exits(1, "audit", "verify")
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"BROKEN  transition_log {seq} (session:{sessions[1]} #")
    assert "does not hash to its link" in first
    status = auditor.json("audit", "status")["last_verified"]
    assert status["ok"] is False and status["first"].startswith(f"transition_log {seq} ")
    broken = json.loads(auditor.exits(1, "audit", "verify", "--json").stdout)
    assert broken["findings"][0]["where"] == f"transition_log {seq}"
    auditor.sql("UPDATE transition_log SET actor = ? WHERE seq = ?", actor, seq)
    auditor.exits(0, "audit", "verify")  # put back as it was: it verifies again

    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(_with_actor(line, seq) + "\n" for line in exported.read_text().splitlines()))
    done = auditor.exits(1, "audit", "verify", "--file", str(edited), "--public-key", str(their_key), cwd=tmp_path)
    assert done.stdout.startswith(f"BROKEN  transition_log {seq} (session:{sessions[1]} #")

    create_key(tmp_path / "other" / "key.pem")  # someone's own key pair
    forged = tmp_path / "other" / "key.pem.pub"
    done = auditor.exits(1, "audit", "verify", "--file", str(exported), "--public-key", str(forged), cwd=tmp_path)
    assert "BROKEN  checkpoint #1" in done.stdout and "not by the verifying key" in done.stdout
    auditor.public_key.write_text(forged.read_text())  # the key file beside the database, replaced
    done = auditor.exits(1, "audit", "verify")
    assert "BROKEN  checkpoint #1" in done.stdout and "not by the verifying key" in done.stdout
    auditor.exits(0, "audit", "verify", "--public-key", str(their_key))  # the auditors' copy still says: intact


def _with_actor(line: str, seq: int) -> str:
    item = json.loads(line)
    if item["type"] == "record" and item["table"] == "transition_log" and item["id"] == seq:
        item["fields"]["actor"] = "operator:mallory"
        return json.dumps(item, sort_keys=True, separators=(",", ":"))
    return line


def test_prune_removes_finished_sessions_records_only_when_told_and_the_rest_still_verifies(auditor, tmp_path):
    auditor.ok("init")
    done_session, running = busy(auditor)
    auditor.ok("session", "fire", done_session[:8], "cancel", "--reason", "not needed")
    before = datetime.now(UTC).isoformat()
    counts = auditor.sql("SELECT count(*) FROM transition_log WHERE session_id = ?", done_session)

    dry = auditor.exits(0, "audit", "prune", "--before", before, "--dry-run").stdout
    assert "would remove" in dry and "of 1 finished session(s)" in dry and "nothing removed" in dry
    refused = auditor.exits(1, "audit", "prune", "--before", before)  # no --yes, no terminal: no question either
    assert "pass --yes" in refused.stderr and "taskgate audit export" in refused.stderr
    assert auditor.sql("SELECT count(*) FROM transition_log WHERE session_id = ?", done_session) == counts

    pruned = auditor.exits(0, "audit", "prune", "--before", before, "--yes").stdout
    assert "removed" in pruned and "of 1 finished session(s)" in pruned and "checkpoint #" in pruned
    assert auditor.sql("SELECT count(*) FROM transition_log WHERE session_id = ?", done_session) == [(0,)]
    assert auditor.sql("SELECT count(*) FROM transition_log WHERE session_id = ?", running)[0][0] > 0
    assert "nothing to prune" in auditor.exits(0, "audit", "prune", "--before", before, "--yes").stdout

    auditor.exits(0, "audit", "verify")
    status = auditor.json("audit", "status")
    assert status["last_verified"]["ok"] is True and status["last_verified"]["findings"] == 0
    assert status["last_checkpoint"]["reason"] == "prune" and status["can_sign"] is True
    human = auditor.ok("audit", "status")
    assert "last verified" in human and ": ok," in human


@pytest.fixture(scope="module")
def set_up(tmp_path_factory: pytest.TempPathFactory) -> tuple[Auditor, Path]:
    """A repository with a session, an export of it (x.jsonl) and a copy of the public key (K) at its root, shared
    by the tests that write nothing."""
    auditor = Auditor(fresh_repo(tmp_path_factory.mktemp("set-up") / "shop"))
    auditor.ok("init")
    busy(auditor, sessions=1)
    exported = auditor.repo / "x.jsonl"
    auditor.ok("audit", "export", "--output", str(exported))
    (auditor.repo / "K").write_text(auditor.public_key.read_text())
    return auditor, exported


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["audit", "export", "--format", "csv"], "--format 'csv' is not an export format: the only one is jsonl"),
        (["audit", "verify", "--since", "yesterday"], "--since: malformed timestamp 'yesterday'"),
        (["audit", "verify", "--since", "2026-11-21T10:00"], "--since '2026-11-21T10:00' has no timezone"),
        (["audit", "export", "--since", "2026-11-21"], "--since '2026-11-21' has no timezone"),
        (["audit", "prune", "--before", "2026-11-21T10:00", "--yes"], "--before '2026-11-21T10:00' has no timezone"),
        (["audit", "verify", "--file", "x.jsonl"], "--file needs --public-key KEY"),
        (["audit", "verify", "--file", "nowhere.jsonl", "--public-key", "K"], "--file nowhere.jsonl: no such file"),
        (["audit", "verify", "--file", "x.jsonl", "--public-key", "nowhere.pub"], "no public key at nowhere.pub"),
        (["audit", "verify", "--file", "x.jsonl", "--public-key", "x.jsonl"], "is not a taskgate audit public key"),
        (["audit", "verify", "--public-key", "x.jsonl"], "is not a taskgate audit public key"),
        (["audit", "verify", "--file", "K", "--public-key", "K"], "K line 1 is not an audit export line"),
        (["audit", "verify", "--file", ".taskgate/README.md", "--public-key", "K"], "README.md line 1 is not"),
        (["audit", "verify", "--file", "x.jsonl", "--session", "abcd", "--public-key", "K"], "do not apply to --file"),
        (["audit", "verify", "--session", "ffffffff"], "session ffffffff not found"),
        (["audit", "export", "--output", "no/such/folder/x.jsonl"], "the folder no/such/folder does not exist"),
        (["audit", "key", "--export", "x.jsonl"], "exists and holds something else"),
    ],
)
def test_bad_input_is_refused_by_name_with_exit_2_and_nothing_is_written(set_up, args, says):
    auditor, _exported = set_up
    events = auditor.sql("SELECT count(*) FROM events")
    before = snapshot(auditor.repo.parent)
    error = auditor.refuses(*args)
    assert says in error, error
    assert snapshot(auditor.repo.parent) == before
    assert auditor.sql("SELECT count(*) FROM events") == events  # not even an audit.verified event


def test_verify_file_loads_no_database_layer(set_up, tmp_path):
    auditor, exported = set_up
    done = subprocess.run(
        [sys.executable, "-X", "importtime", TASKGATE, "audit", "verify", "--file", str(exported), "--public-key",
         str(auditor.public_key)],
        cwd=tmp_path, env=auditor.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "taskgate" in imported and imported.isdisjoint({"sqlalchemy", "alembic", "mcp", "aiosqlite", "asyncpg"})


def test_key_prints_the_public_line_and_exports_it(set_up, tmp_path):
    auditor, _exported = set_up
    out = auditor.ok("audit", "key").splitlines()
    assert out[0] == auditor.public_key.read_text().strip() and out[1].startswith("key id ")
    target = tmp_path / "for-the-auditors.pub"
    auditor.ok("audit", "key", "--export", str(target))
    assert target.read_text() == auditor.public_key.read_text()
    auditor.ok("audit", "key", "--export", str(target))  # the same key again: fine


def _before_0014(database: Path) -> None:
    """Take the database back to schema 0013, as it was before the audit chains: its records unchained."""
    from taskgate.infrastructure.db import migrations
    from taskgate.infrastructure.db.engine import Database

    async def downgrade() -> None:
        db = Database(f"sqlite:///{database}")
        try:
            await migrations.downgrade(db, "0013")
        finally:
            await db.dispose()

    asyncio.run(downgrade())


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
              "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}  # fmt: skip


def test_init_and_serve_seal_a_database_migrated_from_before_0014_with_a_migration_checkpoint(auditor: Auditor):
    auditor.ok("init")
    busy(auditor, sessions=1)
    _before_0014(auditor.database)
    out = auditor.ok("init")  # migrates to 0014 (chaining every record), then signs them
    assert "signed audit checkpoint #1 over 3 chain(s) no checkpoint covered yet" in out
    assert auditor.json("audit", "status")["last_checkpoint"]["reason"] == "seal"

    _before_0014(auditor.database)
    auditor.env["TASKGATE_AUDIT__CHECKPOINT_INTERVAL_S"] = "0"  # the sweeper signs nothing: only the seal at start
    served = subprocess.run([TASKGATE, "serve"], cwd=auditor.repo, env=auditor.env, input=json.dumps(INITIALIZE) + "\n",
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert served.returncode == 0 and '"serverInfo"' in served.stdout, served.stderr
    assert "audit: signed checkpoint #1 over the " in served.stderr  # its chains and this node's first event
    status = auditor.json("audit", "status")
    assert status["last_checkpoint"]["reason"] == "seal" and status["unsigned_chains"] == 0
    auditor.exits(0, "audit", "verify")


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A PostgreSQL database of this test's own (the shared test database holds other tests' chains and keys)."""
    from tests.conftest import pg_admin, pg_database_url

    name = f"taskgate_test_audit_cli_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = pg_database_url(name)
    pg_admin(f'CREATE DATABASE "{name}"')
    yield url
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg(url: str, statement: str, *params: object) -> list:
    import asyncpg
    from sqlalchemy.engine import make_url

    async def run() -> list:
        conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
        try:
            return await conn.fetch(statement, *params)
        finally:
            await conn.close()

    return asyncio.run(run())


def test_on_postgresql_the_same_commands_sign_verify_export_and_name_an_edited_record(auditor, pg_database, tmp_path):
    auditor.env["TASKGATE_DATABASE_URL"] = pg_database
    assert "signed audit checkpoint #1" in auditor.ok("init")
    [session] = busy(auditor, sessions=1)
    auditor.ok("audit", "checkpoint")
    assert auditor.json("audit", "verify")["ok"]
    exported = tmp_path / "pg.jsonl"
    auditor.ok("audit", "export", "--session", session, "--output", str(exported))
    auditor.exits(0, "audit", "verify", "--file", str(exported), "--public-key", str(auditor.public_key), cwd=tmp_path)

    seq = _pg(pg_database, "SELECT seq FROM transition_log WHERE session_id = $1 ORDER BY seq", session)[1]["seq"]
    _pg(pg_database, "UPDATE transition_log SET actor = 'operator:mallory' WHERE seq = $1", seq)
    done = auditor.exits(1, "audit", "verify", "--session", session[:8])
    assert done.stdout.startswith(f"BROKEN  transition_log {seq} (session:{session} #")


def test_an_export_piped_into_a_reader_that_stops_early_ends_quietly(auditor: Auditor):
    # `taskgate audit export | head`: the reader closes the pipe before taskgate writes; that is no error of
    # taskgate's, so no "internal error" line (it was, with exit 3), and the status of every command whose reader
    # stops early (Typer's): 1.
    auditor.ok("init")
    busy(auditor, sessions=1)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        done = subprocess.run([TASKGATE, "audit", "export"], cwd=auditor.repo, env=auditor.env, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert "error" not in done.stderr.lower() and "Traceback" not in done.stderr
