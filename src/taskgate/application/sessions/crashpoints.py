"""Named crash points: the step boundaries of taskgate's multi-step operations, where a test kills the process.

Every operation that takes more than one commit, or a commit and outside work (git, a process), has its step
boundaries named here. `reached(name)` is called at each; when the environment variable `TASKGATE_CRASH_AT`
names that point, the process sends itself SIGKILL there: no `finally`, no flush, no lifespan shutdown, exactly
what a power cut or an OOM kill leaves. `tests/e2e/test_crash_points.py` arms each point in turn on a real
`taskgate serve` and checks that the restarted service carries the session to where it would have gone.

Unset (every real deployment), `reached` is one dictionary lookup and a comparison.
"""

from __future__ import annotations

import os
import signal

ENV = "TASKGATE_CRASH_AT"

# point → what has happened when it is reached (and so what a crash there leaves behind)
POINTS: dict[str, str] = {
    "start.created": "the session row is committed (created); initialize is not fired",
    "start.initializing": "initialize is committed; the worktree is not created",
    "start.worktree": "the worktree exists; context_discovered is not fired",
    "start.ready": "context_discovered is committed (ready); the operator's start is not fired",
    "execute.plan_complete": "plan_complete is committed (executing, the launch recorded); no agent row exists",
    "execute.queued": "the agents' rows are committed (queued); no process is started",
    "agents.ended": "the run's last agent is recorded ended; work_complete is not fired",
    "decide.request_changes": "request_changes is committed (executing, the relaunch recorded); no agent row",
    "retry.recorded": "retry is committed (executing, the relaunch recorded); no agent row exists",
    "decide.reject": "reject with auto_revert is committed (failed); compensate is not fired",
    "compensate.reset": "the worktree is reset and removed; compensate is not committed",
    "compensate.rolled_back": "compensate is committed (rolled_back); cleanup_done is not fired",
    "merge.requested": "the merge request is recorded on the session; git has not merged",
    "merge.git_done": "git merged the branch into the base; merged is not committed",
    "merge.merged": "merged is committed; the worktree and branch are not removed",
    "cleanup.discarded": "the worktree and branch are removed; cleanup_done is not committed",
}

_armed: list[str | None] = []  # read once, on first use (nothing is read at import time)


def reached(point: str) -> None:
    """Die here (SIGKILL) when `TASKGATE_CRASH_AT` names `point`; otherwise do nothing."""
    if not _armed:
        _armed.append(os.environ.get(ENV) or None)
    if _armed[0] is not None and _armed[0] == point:
        assert point in POINTS, f"unnamed crash point {point}"
        os.kill(os.getpid(), signal.SIGKILL)
