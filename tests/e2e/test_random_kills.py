"""A small random-kill run on SQLite and on PostgreSQL, so `benchmarks/random_kills.py`'s harness
(tests/support/random_kills.py) keeps working: six seeded lifecycles on a real `taskgate serve --http`, killed
with SIGKILL by timers, at armed crash points and during a start-up, must lose no acknowledged write, leave no
session stuck and leave git as each lifecycle's end says.

The seed's plans cover every ending (merge, with and without a rebase; reject with auto_revert; cancel), request
changes, a failed agent and its retry, and armed points in the start, execute, compensation and merge families,
among them `merge.git_done` of a merge that had to rebase (issue 36: the session stayed in awaiting_merge).
Timer kills land wherever the machine's speed puts them, so two runs do not kill at the same instructions; the
harness reads each session's state before every call, so a finding is the server's, not the timing's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taskgate.application.sessions.crashpoints import POINTS
from tests.e2e.test_crash_points import _pg_database
from tests.support.random_kills import COMMON_POINTS, ENDING_POINTS, Ack, Report, missing_from, run_random_kills

pytestmark = pytest.mark.slow

SEED, LIFECYCLES = 1842, 6


def test_every_named_crash_point_can_be_armed_by_some_plan():
    drawable = {*COMMON_POINTS, *(p for points in ENDING_POINTS.values() for p in points)}
    assert drawable | {"retry.recorded", "decide.request_changes"} == set(POINTS)


def row(version: int, trigger: str, to_state: str, seq: int, outcome: str = "applied") -> dict[str, object]:
    return {"session_version": version, "trigger": trigger, "to_state": to_state, "seq": seq, "outcome": outcome,
            "actor": "operator:alice", "from_state": None, "reason": None}  # fmt: skip


def test_an_acknowledged_write_is_lost_when_its_row_is_missing_or_different():
    log = [row(1, "create", "created", 1), row(2, "approve", "awaiting_merge", 7)]
    approve = Ack("s", "project_decide", 2, "awaiting_merge", 1, decision="approve")
    merge = Ack("s", "project_session_merge", 3, "completed", 1, seq=9, trigger="merge")
    assert missing_from(approve, log, {"approve"}) == ""
    assert "no row" in missing_from(merge, log, set())
    assert "not recorded" in missing_from(approve, log, set())  # the decision itself is gone
    rewritten = [log[0], row(2, "reject", "failed", 7)]
    assert "reject → failed" in missing_from(approve, rewritten, {"approve"})
    blocked = [*log, row(3, "merge", "completed", 9, outcome="blocked")]
    assert missing_from(merge, blocked, set())  # a refusal is not the merge it answered


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_seeded_random_kill_run_loses_no_acknowledged_write_and_leaves_no_session_stuck(backend: str, tmp_path: Path):
    databases = _pg_database() if backend == "postgresql" else iter([None])
    try:
        report = run_random_kills(tmp_path, backend, next(databases), LIFECYCLES, SEED, stuck_after_s=30,
                                  say=lambda _: None)  # fmt: skip
    finally:
        for _ in databases:  # drops the PostgreSQL database
            pass
    assert not report.findings, describe(report)
    assert report.lifecycles == LIFECYCLES
    assert set(report.outcomes) == {"merged", "rejected", "cancelled"}, report.outcomes
    assert sum(report.kills.values()) >= LIFECYCLES, report.kills
    assert report.checked_after_kill > 0 and report.acknowledged >= 2 * LIFECYCLES, report


def describe(report: Report) -> str:
    """The findings as the benchmark lists them."""
    return "\n".join(f"{f.kind} {f.task} {f.session_id}: {f.what}\n  plan: {f.scenario}\n"
                     + "".join(f"  log: {line}\n" for line in f.last_states)
                     + "".join(f"  error: {line}\n" for line in f.errors) for f in report.findings)  # fmt: skip
