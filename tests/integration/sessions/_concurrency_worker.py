"""A separate OS process that hammers a shared taskgate database (driven by test_concurrency.py).

Self-contained on purpose: it imports only `taskgate` (installed in the venv), never the `tests` package.

Protocol: argv[1] is a JSON spec. The worker builds its services, opens a connection, prints `ready`, and
waits for one line on stdin, so that both workers start their calls at the same moment. Then it runs every
call of the spec concurrently (one asyncio.gather) and prints one JSON line with one outcome per call:

    {"kind": "start" | "toggle" | "create" | "decide", "key": <task or session id>, "trigger": ...,
     "outcome": "applied" | <taskgate error class name> | "unexpected", ...details}

A `decide` spec ({"session_id", "operator", "decision", "count", "expected_version"}) sends `count` identical
decisions, every other one carrying `expected_version`; `workflows` (a config dir) wires a workflow engine
(without agents) so that decisions answer the approval step a session waits on, and the worker waits for
the drivers its decisions woke before it reports.

An exception that is not a TaskgateError is reported as "unexpected" (with its repr) rather than crashing,
so the test can show what went wrong; the exit code is 0 whenever the protocol completed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from taskgate.application.operators.decisions import Decide, DecisionResult, DecisionService
from taskgate.application.sessions.commands import CreateSession, FireTrigger, StartTask
from taskgate.application.workflows.engine import WorkflowEngine
from taskgate.application.workflows.library import WorkflowService
from taskgate.bootstrap import build_services, build_workflows
from taskgate.domain.errors import InvalidTransition, PolicyViolation, TaskgateError
from taskgate.domain.policies.book import default_policies
from taskgate.infrastructure.db.engine import Database
from taskgate.infrastructure.db.unit_of_work import SqlAlchemyUnitOfWork
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from taskgate.infrastructure.workflow_files import WorkflowFiles


def _describe_error(exc: BaseException) -> dict[str, Any]:
    if not isinstance(exc, TaskgateError):
        return {"outcome": "unexpected", "error": repr(exc)}
    found: dict[str, Any] = {"outcome": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, PolicyViolation):
        found["policies"] = [v.policy for v in exc.violations]
        found["session_id"] = exc.session_id
    if isinstance(exc, InvalidTransition):
        found["state"] = exc.state
        found["session_id"] = exc.session_id
    return found


async def _call(kind: str, key: str, trigger: str | None, make: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"kind": kind, "key": key, "trigger": trigger}
    try:
        result = await make()
    except BaseException as exc:  # reported, judged by the test
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            raise
        return {**base, **_describe_error(exc)}
    if isinstance(result, DecisionResult):
        return {**base, **_described_decision(result)}
    session = getattr(result, "session", result)
    record = getattr(result, "record", None)
    return {
        **base,
        "outcome": "applied",
        "session_id": session.id,
        "state": session.state.value,
        "version": session.version,
        "record_version": record.session_version if record else None,
    }


def _described_decision(result: DecisionResult) -> dict[str, Any]:
    d = result.decision
    return {
        "outcome": "applied",
        "replayed": result.replayed,
        "pending": result.pending,
        "decision_id": d.id,
        "decision": d.decision.value,
        "decision_version": d.session_version,
        "to_state": d.to_state,
        "state": result.session.state.value,
        "version": result.session.version,
    }


def _decide_calls(decisions: DecisionService, spec: dict[str, Any]) -> list[Any]:
    cmd = Decide(spec["session_id"], spec["operator"], spec["decision"])
    sent = [cmd if i % 2 else replace(cmd, expected_version=spec["expected_version"]) for i in range(spec["count"])]
    return [_call("decide", c.session_id, c.decision, lambda c=c: decisions.decide(c)) for c in sent]


async def main(spec: dict[str, Any]) -> int:
    url = spec["url"]
    # Modest pools: two workers plus the test process must stay well inside PostgreSQL's max_connections.
    database = Database(url, pool_size=5, max_overflow=10)

    def uow(*, write: bool) -> SqlAlchemyUnitOfWork:
        return SqlAlchemyUnitOfWork(database, write=write)

    clock = SystemClock()
    sessions, _tracker, _audit, _access = build_services(
        uow, clock=clock, ids=UuidGenerator(), vcs=GitPythonVcs(), policies=default_policies(spec["wip_limit"])
    )
    decisions = DecisionService(uow, sessions, clock)
    engine: WorkflowEngine | None = None
    if spec.get("workflows"):
        catalogue = WorkflowService(WorkflowFiles(Path(spec["workflows"])))
        engine = build_workflows(sessions, uow, catalogue=catalogue.catalogue, clock=clock, agents=None,
                                 decisions=decisions)  # fmt: skip
    try:
        await sessions.list_sessions()  # connect (and import the dialect) before the starting gun
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 3
        actor, operator = spec["actor"], spec.get("operator")
        calls = [
            *(
                _call(
                    "start",
                    task_id,
                    "start",
                    lambda task_id=task_id: sessions.start_task(StartTask(task_id, actor, operator)),
                )
                for task_id in spec.get("start_tasks", ())
            ),
            *(
                _call(
                    "toggle",
                    session_id,
                    trigger,
                    lambda s=session_id, t=trigger: sessions.fire(FireTrigger(s, t, actor)),
                )
                for session_id, trigger in spec.get("toggles", ())
            ),
            *(
                _call(
                    "create",
                    spec["create_task"],
                    "create",
                    lambda: sessions.create_session(CreateSession(spec["create_task"], actor, operator)),
                )
                for _ in range(spec.get("creates", 0))
            ),
            *(_decide_calls(decisions, spec["decide"]) if spec.get("decide") else ()),
        ]
        outcomes = await asyncio.gather(*calls)
        if engine is not None:  # the drivers the answers woke finish before the test looks
            await asyncio.wait_for(engine.wait(spec["decide"]["session_id"]), timeout=30)
        print(json.dumps({"outcomes": outcomes}), flush=True)
        return 0
    finally:
        await database.dispose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
