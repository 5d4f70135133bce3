"""The throwaway PostgreSQL server a test run starts when no other is reachable (tests/support/pg_server.py):
it starts, takes the suite's migrations, and is stopped and deleted when its process exits. Run on every machine,
whatever server the rest of the suite uses, so the fresh-machine path is proven in every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import asyncio, json, sys
from urllib.parse import unquote
from sqlalchemy.engine import make_url
from taskgate.infrastructure.db import migrations
from taskgate.infrastructure.db.engine import Database
from tests.support import pg_server

url = pg_server.server_url()

async def main():
    db = Database(url)
    try:
        await migrations.upgrade(db)
        async with db.connect() as conn:
            tables = (await conn.exec_driver_sql("select count(*) from information_schema.tables "
                                                  "where table_name = 'sessions'")).scalar()
    finally:
        await db.dispose()
    print(json.dumps({"url": url, "folder": unquote(make_url(url).query["host"]), "sessions_table": tables}))

asyncio.run(main())
"""


def test_with_no_server_reachable_a_throwaway_one_starts_migrates_and_is_gone_at_exit(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TASKGATE_TEST_PG_URL"}
    env["PYTHONPATH"] = str(ROOT)
    # the default address made unreachable for the child: it must fall back to the throwaway server
    code = CHILD.replace("url = pg_server.server_url()", "pg_server._answers = lambda host, port: False\n"
                         "url = pg_server.server_url()")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["url"].startswith("postgresql+asyncpg://postgres@/postgres?host=")
    assert report["sessions_table"] == 1  # the real migrations ran on it
    folder = report["folder"]
    assert not Path(folder).exists()  # deleted when the process exited
    running = [p for p in psutil.process_iter(["cmdline"]) if folder in " ".join(p.info["cmdline"] or [])]
    assert running == []


def test_the_url_the_environment_names_wins(monkeypatch):
    from tests.support import pg_server

    monkeypatch.setenv("TASKGATE_TEST_PG_URL", "postgresql+asyncpg://someone@db.example:5433/x")
    # uncached: the run's own server (cached) is left as it is
    assert pg_server.server_url.__wrapped__() == "postgresql+asyncpg://someone@db.example:5433/x"
