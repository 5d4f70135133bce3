"""The audit chains under concurrent writers (issue 21): two OS processes fire 200 transitions at once on 50
shared sessions, each process 100 at a time with asyncio, on SQLite and on PostgreSQL. Whatever order the writers
were serialised in, every chain must come out whole: seqs 1..N, head rows agreeing, one link per record, one
transition row per acknowledged transition, and a verification with no finding, before and after a checkpoint.
Then a second round of 100 runs while a third writer, this process, signs checkpoints in a loop over the heads
the two processes keep moving: those checkpoints must verify too.

The sessions are moved by the engine alone, without the worktree effects (as the workers are wired): what is
under test is the chaining of concurrent transactions, and 50 worktrees would only add git processes."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from taskgate.application.audit.ledger import AuditLedger, Scope
from taskgate.application.sessions.commands import StartTask
from taskgate.application.sessions.engine import SessionService
from taskgate.application.trackers.builtin import AddTask
from taskgate.bootstrap import build_services
from taskgate.domain.policies.book import default_policies
from taskgate.infrastructure.db.audit_store import CHECKPOINT_CHAIN
from taskgate.infrastructure.git import GitPythonVcs
from taskgate.infrastructure.system import SystemClock, UuidGenerator
from tests.audit_support import ledger_of, new_signer, problems, raw, whole_chains
from tests.conftest import SQL_BACKENDS, Services, open_database, wire

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(120)]

WORKER = Path(__file__).with_name("_worker.py")
WORKER_TIMEOUT_S = 45.0  # per wait (get ready, one round, exit)
SESSIONS = 50
PER_SESSION = 2  # toggles per session per process: 2 processes x 50 sessions x 2 = 200 transitions


@pytest.fixture(params=SQL_BACKENDS)
async def services(request: pytest.FixtureRequest, tmp_path: Path):
    database, url = await open_database(request.param, request, tmp_path)
    yield wire(request.param, database, url)
    await database.dispose()


class Workers:
    """The two worker processes (_worker.py), started once; each `round()` releases both together."""

    def __init__(self, svc: Services, logs: Path) -> None:
        self._specs = [{"url": svc.url, "actor": f"worker-{n}"} for n in range(2)]
        self._logs = [logs / f"worker-{n}.log" for n in range(2)]
        self._procs: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> Workers:
        for spec, log in zip(self._specs, self._logs, strict=True):
            with log.open("wb") as err:  # a file, not a pipe: a chatty worker never blocks on it
                self._procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, str(WORKER), json.dumps(spec),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                ))  # fmt: skip
        return self

    async def ready(self) -> None:
        assert await self._lines() == [b"ready"] * 2

    async def round(self, session_ids: list[str], per_session: int) -> list[dict[str, Any]]:
        """Both workers toggle each of these sessions `per_session` times, all at once; their reports."""
        line = f"go {json.dumps({'sessions': session_ids, 'per_session': per_session})}\n".encode()
        for proc in self._procs:
            proc.stdin.write(line)
        return [json.loads(line) for line in await self._lines()]

    async def _lines(self) -> list[bytes]:
        lines = await asyncio.wait_for(asyncio.gather(*(p.stdout.readline() for p in self._procs)), WORKER_TIMEOUT_S)
        for line, log in zip(lines, self._logs, strict=True):
            assert line, f"a worker stopped: {log.read_text(errors='replace')[-3000:]}"
        return [line.strip() for line in lines]

    async def __aexit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.stdin.close()
        try:
            codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in self._procs)), WORKER_TIMEOUT_S)
        finally:
            for proc in self._procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        assert codes == [0, 0], [log.read_text(errors="replace")[-3000:] for log in self._logs]


def bare_engine(svc: Services) -> SessionService:
    """The session engine on `svc`'s database without worktree effects, as the workers are wired."""
    sessions, *_ = build_services(
        svc.uow, clock=SystemClock(), ids=UuidGenerator(), vcs=GitPythonVcs(), policies=default_policies(1000)
    )  # a WIP limit of 1000: resume re-enters the WIP window, and is never refused here
    return sessions


async def planning_sessions(svc: Services, repo: Path, count: int) -> list[str]:
    """`count` sessions started (create, initialize, context_discovered, start): in `planning`. Each has a plan of
    its own, so that the writers meet only on their sessions (and chains), not on a plan's WIP lock."""
    project = await svc.tracker.init_project(str(repo))
    tasks = []
    for i in range(count):
        plan = await svc.tracker.add_plan(project.id, f"plan {i}")
        tasks.append(await svc.tracker.add_task(AddTask(project.id, f"task {i}", plan_id=plan.id)))
    engine = bare_engine(svc)
    started = await asyncio.gather(*(engine.start_task(StartTask(t.id, "alice")) for t in tasks))
    return [result.session.id for result in started]


async def transition_rows(svc: Services) -> int:
    return (await raw(svc, "SELECT count(*) FROM transition_log"))[0][0]


async def session_versions(svc: Services, session_ids: list[str]) -> dict[str, int]:
    return {s: (await svc.sessions.get(s)).version for s in session_ids}


async def records_per_session(svc: Services) -> dict[str, int]:
    """How many audited records each session has (its transition rows and events; these sessions have no decision)."""
    counts: dict[str, int] = defaultdict(int)
    for table in ("transition_log", "events"):
        grouped = f"SELECT session_id, count(*) FROM {table} WHERE session_id IS NOT NULL GROUP BY session_id"
        for session_id, count in await raw(svc, grouped):
            counts[f"session:{session_id}"] += count
    return counts


def acknowledged(reports: list[dict[str, Any]], versions: dict[str, int], per_session: int) -> int:
    """Each session took its 2 x `per_session` toggles as distinct consecutive versions; how many in all."""
    assert [r["unexpected"] for r in reports] == [[], []]
    acked: dict[str, list[int]] = defaultdict(list)
    for report in reports:
        for session_id, version in report["acked"]:
            acked[session_id].append(version)
    for session_id, start in versions.items():
        assert sorted(acked[session_id]) == list(range(start + 1, start + 1 + 2 * per_session)), session_id
    return sum(len(v) for v in acked.values())


async def checkpoints_until(ledger: AuditLedger, done: asyncio.Task) -> list[int]:
    """Sign checkpoints (over whatever grew) until `done` is; the numbers of those made. Each links what the workers
    committed first; a round that ended before any checkpoint found something grown is signed by one more after it."""
    made = []
    while not done.done():
        cp = await ledger.checkpoint(only_if_grown=True)
        if cp is not None:
            made.append(cp.number)
        await asyncio.sleep(0.005)  # leave the workers room between two checkpoints
    if not made and (cp := await ledger.checkpoint(only_if_grown=True)) is not None:
        made.append(cp.number)
    return made


async def assert_round_whole(svc: Services, reports: list[dict[str, Any]], rows_before: int,
                             versions: dict[str, int], per_session: int) -> dict[str, int]:  # fmt: skip
    """Every toggle acknowledged once, one transition row each, and every chain whole; the chains' lengths."""
    transitions = 2 * len(versions) * per_session
    assert acknowledged(reports, versions, per_session) == transitions
    assert await transition_rows(svc) == rows_before + transitions
    lengths = await whole_chains(svc)
    assert {c: n for c, n in lengths.items() if c.startswith("session:")} == await records_per_session(svc)
    return lengths


async def test_200_concurrent_transitions_from_two_processes_on_50_sessions_chain_whole_and_verify(
    services, git_repo, tmp_path
):
    ledger = ledger_of(services, new_signer(tmp_path / "keys"))
    session_ids = await planning_sessions(services, git_repo, SESSIONS)
    async with Workers(services, tmp_path) as workers:
        await workers.ready()

        # 1. the two processes alone: whole chains, a verification without findings, a checkpoint, verified again
        rows, versions = await transition_rows(services), await session_versions(services, session_ids)
        reports = await workers.round(session_ids, PER_SESSION)
        lengths = await assert_round_whole(services, reports, rows, versions, PER_SESSION)
        report = await ledger.verify(Scope(), record=False)
        assert report.ok and report.findings == [], problems(report)
        assert report.records == sum(lengths.values()) and report.unsigned == report.records
        cp = await ledger.checkpoint()
        assert cp is not None and {f"session:{s}" for s in session_ids} <= set(cp.heads)
        signed = await ledger.verify(Scope(), record=False)
        assert signed.ok and signed.unsigned == 0 and signed.records == report.records, problems(signed)

        # 2. 100 more, with this process signing checkpoints in a loop while the two append
        rows, versions = await transition_rows(services), await session_versions(services, session_ids)
        second = asyncio.create_task(workers.round(session_ids, 1))
        made = await checkpoints_until(ledger, second)
        lengths = await assert_round_whole(services, await second, rows, versions, 1)
    assert made and made == list(range(2, len(made) + 2))
    meanwhile = await ledger.verify(Scope(), record=False)  # the newest records may be unsigned yet: still whole
    assert meanwhile.ok and meanwhile.checkpoints == 1 + len(made), problems(meanwhile)
    await ledger.checkpoint()
    final = await ledger.verify(Scope(), record=False)
    assert final.ok and final.unsigned == 0 and final.records == sum(lengths.values()), problems(final)
    marks = await raw(services, "SELECT chain_id, seq, signed_seq FROM audit_chains WHERE chain_id <> :c",
                      c=CHECKPOINT_CHAIN)  # fmt: skip
    assert {chain: (seq, signed) for chain, seq, signed in marks} == {c: (n, n) for c, n in lengths.items()}
