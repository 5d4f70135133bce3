"""`SubprocessTestRunner`: real commands, real timeouts, real process groups."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from taskgate.infrastructure.test_runner import SubprocessTestRunner


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


async def test_exit_code_output_and_duration_of_a_finished_command(tmp_path):
    command = (sys.executable, "-c", "import os, sys; print(os.getcwd()); print('oops', file=sys.stderr); sys.exit(3)")
    outcome = await SubprocessTestRunner().run(command, str(tmp_path), timeout_s=30)
    assert (outcome.exit_code, outcome.timed_out) == (3, False)
    assert str(tmp_path) in outcome.output_tail and "oops" in outcome.output_tail  # cwd is the worktree; 2>&1
    assert 0 <= outcome.duration_ms < 30_000


async def test_only_the_tail_of_a_chatty_command_is_kept(tmp_path):
    command = (sys.executable, "-c", "for i in range(100000): print(f'line {i}')")
    outcome = await SubprocessTestRunner(tail_bytes=1000).run(command, str(tmp_path), timeout_s=30)
    assert outcome.exit_code == 0 and len(outcome.output_tail) <= 1000
    assert outcome.output_tail.rstrip().endswith("line 99999")


async def test_a_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    child = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('spawned', flush=True); time.sleep(60)"
    )
    outcome = await SubprocessTestRunner().run((sys.executable, "-c", parent), str(tmp_path), timeout_s=1.5)
    assert outcome.timed_out and outcome.exit_code is None
    assert "spawned" in outcome.output_tail and "killed after 1.5 s (timeout)" in outcome.output_tail
    assert outcome.duration_ms < 10_000
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # the kill is immediate; reaping by init may take a moment
        if not alive(grandchild):
            break
        await asyncio.sleep(0.1)
    assert not alive(grandchild), "the test command's own child survived the timeout"


async def test_a_child_that_keeps_the_pipe_open_does_not_hold_a_finished_run(tmp_path):
    parent = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('done')"
    )
    outcome = await SubprocessTestRunner().run((sys.executable, "-c", parent), str(tmp_path), timeout_s=20)
    assert (outcome.exit_code, outcome.timed_out) == (0, False) and "done" in outcome.output_tail
    assert outcome.duration_ms < 10_000


async def test_a_missing_program_is_an_outcome_not_an_exception(tmp_path):
    outcome = await SubprocessTestRunner().run(("no-such-test-runner-xyz",), str(tmp_path), timeout_s=5)
    assert outcome.exit_code is None and not outcome.timed_out and "could not start" in outcome.output_tail
    assert os.path.isdir(tmp_path)
