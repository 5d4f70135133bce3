"""A separate OS process that fires transitions concurrently on a SQLite file and is killed mid-way
(driven by test_group_commit.py).

Self-contained on purpose: it imports only `taskgate`, never the `tests` package.

argv[1] is a JSON spec: {"url", "sessions": [ids of sessions in a suspendable state], "crash": "random" |
"before_commit" | "after_commit"}. Every session cycles suspend/resume, one coroutine per session, all at
once. After each fire returns (the transition is acknowledged) the worker prints `ack <session> <version>`,
flushed, so the test knows exactly what was acknowledged before the kill.

`before_commit` / `after_commit`: the worker kills itself (SIGKILL) at that boundary of the eleventh commit group
holding at least 3 members, after printing `doomed <max seq inside the group's transaction>` (before) or
`committed <max seq after the COMMIT>` (after). `random`: the test kills it whenever it likes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from taskgate.application.sessions.commands import FireTrigger
from taskgate.bootstrap import build_services
from taskgate.domain.policies.book import default_policies
from taskgate.infrastructure.db import commit_group
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator

CYCLE = ("suspend", "resume")
SPARED_GROUPS = 10  # groups of 3+ members committed normally before the armed one, so some acks come first


def _max_seq(group: Any) -> int:
    return group.conn.sync_connection.exec_driver_sql("SELECT max(seq) FROM transition_log").scalar_one()


def arm(crash: str) -> None:
    """Kill this process at `crash`'s boundary of a group of 3 or more members, after SPARED_GROUPS such groups."""
    close = commit_group.CommitGroups._close
    spared = [SPARED_GROUPS]

    def dying_close(self: commit_group.CommitGroups, group: Any) -> None:
        if group.released < 3 or spared[0] > 0:
            spared[0] -= group.released >= 3
            close(self, group)
            return
        if crash == "before_commit":
            print(f"doomed {_max_seq(group)}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        group.conn.sync_connection.commit()  # the real COMMIT, then die before any member is woken
        print(f"committed {_max_seq(group)}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    commit_group.CommitGroups._close = dying_close  # type: ignore[method-assign]


async def cycle(sessions: Any, session_id: str) -> None:
    """suspend, resume, suspend, ... printing each acknowledged version, until the process is killed."""
    i = 1 if (await sessions.get(session_id)).state.value == "suspended" else 0  # a killed round left it so
    while True:
        result = await sessions.fire(FireTrigger(session_id, CYCLE[i % 2], "crash-test"))
        print(f"ack {session_id} {result.session.version}", flush=True)
        i += 1


async def main(spec: dict[str, Any]) -> int:
    if spec["crash"] != "random":
        arm(spec["crash"])
    database = Database(spec["url"])

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    sessions, *_ = build_services(
        uow, clock=SystemClock(), ids=UuidGenerator(), vcs=GitPythonVcs(), policies=default_policies(1000)
    )
    print("ready", flush=True)
    await asyncio.gather(*(cycle(sessions, s) for s in spec["sessions"]))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
