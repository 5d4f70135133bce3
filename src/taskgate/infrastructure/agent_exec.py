"""`python -m taskgate.infrastructure.agent_exec EXITFILE [--sandbox SPEC] -- ARGV…`: run one agent and record how
it ended.

The supervisor starts every agent through this small wrapper (standard library only, so it starts fast). The
wrapper leads the agent's process group, runs ARGV as its child, and writes the child's exit status to
EXITFILE (atomically) before exiting with the same status. A supervisor restarted after a crash can then
re-attach to a still-running agent by its process id and, once it is gone, read how it ended. A stop's SIGTERM
reaches the agent and the wrapper alike (the whole group): the wrapper waits for the agent and records its end
(-15: ended by SIGTERM); SIGKILL ends both.

With `--sandbox SPEC` (a sandboxed agent, ARGV being bwrap's command line), the wrapper first enters the agent's
limits (its cgroup, so every process the agent starts counts) and serves its network gate (a thread: the agent's
only way out, see sandbox/egress.py) for as long as the agent runs; it ends the group and says which limit ended
the agent, if one did.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys


def _stay(signum: int, frame: object) -> None:
    """SIGTERM goes to the whole group: the agent decides how to end, and the wrapper stays to record it. (A
    handler, not SIG_IGN: an ignored signal would stay ignored in the agent after exec.)"""


def main(argv: list[str]) -> int:
    spec = None
    if len(argv) >= 3 and argv[1] == "--sandbox":
        spec, argv = argv[2], [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--":
        print(
            "usage: python -m taskgate.infrastructure.agent_exec EXITFILE [--sandbox SPEC] -- ARGV...", file=sys.stderr
        )
        return 2
    exit_file, command = argv[0], argv[2:]
    signal.signal(signal.SIGTERM, _stay)
    try:
        confined = _Confined(spec) if spec else None
    except Exception as exc:  # a sandbox that cannot be set up: the agent does not run unconfined instead
        print(f"[taskgate sandbox] could not set up the sandbox: {exc!r}", flush=True)
        return _record(exit_file, 126)
    try:
        # inherits stdout/stderr (the output file) and the process group; a sandboxed child enters its limits
        # before exec (the wrapper itself stays outside them, so it can end and remove the group afterwards)
        child = subprocess.Popen(command, preexec_fn=confined.enter if confined else None)
        if confined is not None:
            try:
                confined.serve()
            except Exception as exc:  # no gate: the agent's connections are refused, nothing more is open
                print(f"[taskgate sandbox] the network gate could not start: {exc!r}", flush=True)
            confined.watch()
        code = child.wait()
    except OSError as exc:
        print(f"[taskgate] could not start {command[0]!r}: {exc}", flush=True)
        code = 127
    finally:
        if confined is not None:
            confined.close()
    return _record(exit_file, code)


def _record(exit_file: str, code: int) -> int:
    """Write the exit status atomically (a re-attaching supervisor reads it) and return the wrapper's own."""
    temporary = f"{exit_file}.tmp"
    with open(temporary, "w") as handle:
        handle.write(str(code))
    os.replace(temporary, exit_file)
    return code if 0 <= code < 256 else 1


class _Confined:
    """The outside half of a sandboxed agent: its limits entered and its network gate served (until `close`)."""

    def __init__(self, spec_path: str) -> None:
        import json
        import threading

        with open(spec_path) as handle:
            spec = json.load(handle)

        # the agent's cgroup was made by the launcher (confinement.write_spec): here only its description, so
        # nothing is imported on the way to the agent's start (the limits module loads in the watcher thread)
        self.group, self.gate, self.reason = None, None, ""
        self.closed = threading.Event()
        self.described = spec.get("group")
        if spec.get("limits_error"):
            print(f"[taskgate sandbox] limits not applied: {spec['limits_error']}", flush=True)
        self.egress = spec.get("egress")

    def serve(self) -> None:
        """The network gate, started once the sandbox is on its way (its import is off the agent's start-up
        path; the in-sandbox forwarder waits for the socket to appear)."""
        if self.egress:
            from taskgate.infrastructure.sandbox.egress import EgressGate

            egress = self.egress
            self.gate = EgressGate(egress["socket"], egress["allow"], egress["refusals"], egress.get("agent", ""))
            self.gate_socket = egress["socket"]
            self.gate.start()

    def watch(self) -> None:
        """A thread: once the agent hits a limit (a fork bomb at its pids limit, an OOM kill), its whole group
        ends, said in its log. Polled: cgroup v1 has no event to wait on that works for both limits."""
        import threading

        def run() -> None:
            self._open_group()
            while not self.closed.wait(0.25):
                reason = self.group.end_reason() if self.group is not None else None
                if reason:
                    print(f"[taskgate sandbox] the agent hit its {reason}: ending it", flush=True)
                    self.reason = reason
                    with contextlib.suppress(OSError, TimeoutError):
                        self.group.kill()
                    return

        if self.described is not None:
            threading.Thread(target=run, daemon=True).start()

    def _open_group(self) -> None:
        if self.group is None and self.described is not None:
            from taskgate.infrastructure.sandbox.limits import Group

            self.group = Group.from_json(self.described["json"])

    def enter(self) -> None:
        """In the child, before exec: SIGTERM ignored by bwrap (confinement.wrap says why), and into the agent's
        limits (a failure leaves it unlimited, said in its log)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.described is None:
            return
        try:
            if self.described["kind"] == "rlimit":
                import resource

                if self.described["memory_bytes"]:
                    cap = self.described["memory_bytes"]
                    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
                return
            for folder in self.described["dirs"]:
                with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
        except OSError as exc:
            os.write(2, f"[taskgate sandbox] limits not applied: {exc}\n".encode())

    def close(self) -> None:
        self.closed.set()
        if self.gate is not None:
            self.gate.close()
            shutil.rmtree(os.path.dirname(self.gate_socket), ignore_errors=True)  # the run folder: socket, spec
        self._open_group()
        if self.group is not None:
            reason = self.group.end_reason()
            if reason and not self.reason:
                print(f"[taskgate sandbox] the agent hit its {reason}", flush=True)
            try:
                self.group.kill()  # bwrap's pid namespace took the agent's leftovers already; this is the net
                self.group.remove()
            except (OSError, TimeoutError) as exc:
                print(f"[taskgate sandbox] the agent's cgroup was not removed: {exc}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
