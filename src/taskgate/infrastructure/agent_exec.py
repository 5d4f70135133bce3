"""`python -m taskgate.infrastructure.agent_exec EXITFILE -- ARGV…`: run one agent and record how it ended.

The supervisor starts every agent through this small wrapper (standard library only, so it starts fast). The
wrapper leads the agent's process group, runs ARGV as its child, and writes the child's exit status to
EXITFILE (atomically) before exiting with the same status. A supervisor restarted after a crash can then
re-attach to a still-running agent by its process id and, once it is gone, read how it ended. A stop's SIGTERM
reaches the agent and the wrapper alike (the whole group): the wrapper waits for the agent and records its end
(-15: ended by SIGTERM); SIGKILL ends both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _stay(signum: int, frame: object) -> None:
    """SIGTERM goes to the whole group: the agent decides how to end, and the wrapper stays to record it. (A
    handler, not SIG_IGN: an ignored signal would stay ignored in the agent after exec.)"""


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m taskgate.infrastructure.agent_exec EXITFILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, command = argv[0], argv[2:]
    signal.signal(signal.SIGTERM, _stay)
    try:
        code = subprocess.call(command)  # inherits stdout/stderr (the output file) and the process group
    except OSError as exc:
        print(f"[taskgate] could not start {command[0]!r}: {exc}", flush=True)
        code = 127
    temporary = f"{exit_file}.tmp"
    with open(temporary, "w") as handle:
        handle.write(str(code))
    os.replace(temporary, exit_file)
    return code if 0 <= code < 256 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
