"""A separate OS process that fires suspend/resume transitions concurrently on sessions another process fires on
too (driven by test_concurrency.py), so that both processes append to the same audit chains at once.

Self-contained on purpose: it imports only `taskgate`, never the `tests` package.

argv[1] is a JSON spec: {"url", "actor"}. The worker builds its services (the engine alone, as the test's setup: no
worktrees) and prints `ready`. Then, for every line `go {"sessions": [ids], "per_session": n}` on stdin (so that
both workers start a round together), it runs a round: `per_session` toggles of each of those sessions (in a state
that can be suspended), all at once (one asyncio.gather). A toggle
reads the session and fires `suspend` (or `resume` when it is suspended) at the version it read; when another
writer got there first (ConcurrentModification, or InvalidTransition from a state read before the other's commit)
it reads again and retries. After each round it prints one JSON line: {"acked": [[session, version], …] of every
acknowledged transition, "retries": n, "unexpected": [repr of anything else]}. Any other line (or the end of
stdin) ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from taskgate.application.sessions.commands import FireTrigger
from taskgate.application.sessions.engine import SessionService
from taskgate.bootstrap import build_services
from taskgate.domain.errors import ConcurrentModification, InvalidTransition
from taskgate.domain.policies.book import default_policies
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator

MAX_ATTEMPTS = 500  # a toggle that never gets through is reported, not retried forever


async def toggle(sessions: SessionService, session_id: str, actor: str, report: dict[str, Any]) -> None:
    """One acknowledged transition of `session_id`: suspend it, or resume it when it is suspended."""
    for _ in range(MAX_ATTEMPTS):
        session = await sessions.get(session_id)
        trigger = "resume" if session.state.value == "suspended" else "suspend"
        try:
            result = await sessions.fire(FireTrigger(session_id, trigger, actor, expected_version=session.version))
        except (ConcurrentModification, InvalidTransition):
            report["retries"] += 1
            continue
        except Exception as exc:  # reported, judged by the test
            report["unexpected"].append(repr(exc))
            return
        report["acked"].append([session_id, result.session.version])
        return
    report["unexpected"].append(f"{session_id}: no turn in {MAX_ATTEMPTS} attempts")


async def main(spec: dict[str, Any]) -> int:
    # Modest pools: two workers plus the test process must stay well inside PostgreSQL's max_connections.
    database = Database(spec["url"], pool_size=5, max_overflow=10)

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    sessions, *_ = build_services(
        uow, clock=SystemClock(), ids=UuidGenerator(), vcs=GitPythonVcs(), policies=default_policies(1000)
    )
    try:
        await sessions.list_sessions()  # connect (and import the dialect) before the starting gun
        print("ready", flush=True)
        while (line := await asyncio.to_thread(sys.stdin.readline)).startswith("go "):
            print(json.dumps(await run_round(sessions, json.loads(line[3:]), spec["actor"])), flush=True)
        return 0
    finally:
        await database.dispose()


async def run_round(sessions: SessionService, spec: dict[str, Any], actor: str) -> dict[str, Any]:
    """`per_session` toggles of each session, all at once; what came of them."""
    report: dict[str, Any] = {"acked": [], "retries": 0, "unexpected": []}
    each = range(spec["per_session"])
    await asyncio.gather(*(toggle(sessions, s, actor, report) for s in spec["sessions"] for _ in each))
    return report


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
