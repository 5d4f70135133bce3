"""How a `SandboxPlan` becomes an agent's command line: `bwrap … -- [inside …] -- ARGV`, the spec files its two
halves read, and the environment its HTTP clients need.

Two halves: outside, `agent_exec` (the wrapper that records the exit status) reads `sandbox.json` and serves the
network gate (egress.py: the allow-list, refusals recorded where the agent cannot write) and puts itself into the
agent's limits (limits.py) before it starts bwrap; inside, `inside.py` forwards the allowed loopback ports and
the proxy port to the gate's socket, then runs the agent. The run folder (the socket and `inside.json`) is shown
read-only inside; the refusals file is not shown at all.
"""

from __future__ import annotations

import json
import os
import sys

from taskgate.domain.sandbox import SandboxPlan
from taskgate.infrastructure.sandbox import bwrap, limits

MAX_WATCHED = 500  # host ports watched inside (an nftables set; more would slow nothing but say little more)
PROXY_PORTS = (3128, 3129, 8118, 18118)  # the in-sandbox proxy's port: the first not forwarded


def proxy_port(plan: SandboxPlan) -> int:
    return next(port for port in PROXY_PORTS if port not in plan.forward_ports)


def filtered(plan: SandboxPlan) -> bool:
    """Whether the agent reaches an allow-list through the gate (not `none`, not `open`)."""
    return not isinstance(plan.network, str)


def write_spec(plan: SandboxPlan, agent: str) -> str:
    """Write the outside spec (for agent_exec) and the inside one (for inside.py); returns the outside one's path.
    Raises: ValueError when the plan names no agent (its cgroup would have no name of its own)."""
    if not plan.agent_id:
        raise ValueError("a sandbox plan without an agent id")
    socket = os.path.join(plan.run_dir, "egress.sock")
    outside: dict = _group(plan)
    if filtered(plan):
        outside["egress"] = {"socket": socket, "allow": list(plan.network), "refusals": plan.refusals,
                             "agent": plan.agent_id or agent}  # fmt: skip
        inside = {"socket": socket, "forward": list(plan.forward_ports), "proxy_port": proxy_port(plan),
                  "catch_all": plan.catch_all}  # fmt: skip
        if plan.catch_all:  # the host's services: reaching one inside is caught and recorded, not just refused
            taken = {*plan.forward_ports, proxy_port(plan)}
            inside["watched"] = sorted(host_listening_ports() - taken)[:MAX_WATCHED]
        _write(os.path.join(plan.run_dir, "inside.json"), inside)
    path = os.path.join(os.path.dirname(plan.refusals), "sandbox.json")  # the agent's own folder, not shown to it
    _write(path, outside)
    return path


def _group(plan: SandboxPlan) -> dict:
    """The agent's own cgroup, made here, in the launcher (limits.py loaded already), named by the agent's id (a
    group shared by two agents would end both at the first's end): its description for agent_exec, whose child
    enters it before exec. A failure is said in the agent's log; the agent still runs (doctor names the cause)."""
    if not plan.limits.pids and not plan.limits.memory_bytes:
        return {}
    wanted = limits.Limits(pids=plan.limits.pids, memory_bytes=plan.limits.memory_bytes)
    try:
        group = limits.create(f"agent-{plan.agent_id}", wanted)
    except (OSError, ValueError) as exc:
        return {"limits_error": str(exc)}
    described = {"kind": group.kind, "dirs": list(group.dirs), "memory_bytes": plan.limits.memory_bytes}
    return {"group": described | {"json": group.to_json()}}


def wrap(plan: SandboxPlan, command: list[str]) -> list[str]:
    """The agent's command, confined. bwrap starts with SIGTERM ignored (agent_exec sets it: a stop's SIGTERM to
    the group must not end bwrap, whose death would SIGKILL the whole sandbox at once, with no grace for the
    agent), so the agent's SIGTERM is set back to its default first: by the in-sandbox init (its own handler), or
    by coreutils' `env --default-signal=TERM`."""
    inner = ["env", "--default-signal=TERM", *command]
    if filtered(plan):
        spec = os.path.join(plan.run_dir, "inside.json")
        inner = [sys.executable, "-m", "taskgate.infrastructure.sandbox.inside", spec, "--", *command]
    return bwrap.argv(plan, inner)


def environment(plan: SandboxPlan) -> dict[str, str]:
    """Proxy variables for an allow-list (loopback stays direct: its allowed ports are forwarded as they are)."""
    if not filtered(plan):
        return {}
    proxy = f"http://127.0.0.1:{proxy_port(plan)}"
    direct = "127.0.0.1,localhost,::1"
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
    return {name: proxy for name in names} | {"NO_PROXY": direct, "no_proxy": direct}


def host_listening_ports() -> set[int]:
    """The TCP ports something listens on, on this host, now (IPv4 and IPv6), from /proc/net."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _write(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)
