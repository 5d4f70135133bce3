"""`python -m taskgate.infrastructure.sandbox.inside SPECFILE -- ARGV…`: the sandbox's init for the network.

Runs inside the agent's network namespace (bwrap `--unshare-net`: only a loopback interface), before the agent.
SPECFILE is JSON: `{"socket": "/path/egress.sock", "forward": [8765, 18080], "proxy_port": 3128}`, and
optionally `"catch_all": true` (as root with CAP_NET_ADMIN: see `catchall`).

- For each port P in `forward` it listens on 127.0.0.1:P and relays each connection to the network gate's Unix
  socket (`egress.EgressGate`, outside the sandbox) as `CONNECT 127.0.0.1:P`: a loopback endpoint (the model,
  taskgate's MCP URL) keeps its URL inside. The gate decides; on anything but 200 the client is closed.
- It listens on 127.0.0.1:`proxy_port` (optional) and relays each connection raw to the gate: clients told
  `HTTPS_PROXY`/`HTTP_PROXY=http://127.0.0.1:<proxy_port>` send their CONNECT or absolute-form request themselves.
- Then it runs ARGV as its child (inherited stdio), forwards SIGTERM, SIGINT and SIGHUP to it, and exits with
  its exit status (128+N when a signal N ended it).

A missing or malformed spec, or a port it cannot listen on, is reported as `[taskgate sandbox] …` on stderr
with exit status 126 (as a shell does for a command it cannot run). Standard library only: it starts with
every agent.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from taskgate.infrastructure.sandbox import catchall
from taskgate.infrastructure.sandbox.catchall import CatchAllError
from taskgate.infrastructure.sandbox.relay import HeadError, read_head, splice

CANNOT_START = 126
# longer than the gate's own connect timeout (egress.CONNECT_TIMEOUT, 10 s), so that its 502 arrives in time
_GATE_ANSWER_TIMEOUT = 30.0
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SpecError(Exception):
    """The spec file is missing or malformed."""


class Spec:
    """What the sandbox's network is: the gate's socket, the loopback ports forwarded, the proxy port, the catch-all.

    A plain class, not a dataclass: `dataclasses` imports `inspect`, a fifth of this module's start-up time.
    """

    def __init__(
        self,
        socket: str,
        forward: tuple[int, ...],
        proxy_port: int | None,
        catch_all: bool,
        watched: tuple[int, ...] = (),
    ) -> None:
        self.socket = socket
        self.watched = watched
        self.forward = forward
        self.proxy_port = proxy_port
        self.catch_all = catch_all


def load_spec(path: str) -> Spec:
    """Read and check the spec file; raises SpecError saying what is wrong."""
    try:
        with open(path) as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read the network spec {path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("socket"), str) or not raw["socket"]:
        raise SpecError(f"the network spec {path} needs a 'socket' path (a JSON object)")
    forward = raw.get("forward", [])
    proxy_port = raw.get("proxy_port")
    if not isinstance(forward, list) or not all(_is_port(port) for port in forward):
        raise SpecError(f"the network spec {path}: 'forward' must be a list of ports (1-65535), not {forward!r}")
    if proxy_port is not None and not _is_port(proxy_port):
        raise SpecError(f"the network spec {path}: 'proxy_port' must be a port (1-65535), not {proxy_port!r}")
    if proxy_port in forward or len(set(forward)) != len(forward):
        raise SpecError(f"the network spec {path} lists a port twice")
    catch_all = raw.get("catch_all", False)
    if not isinstance(catch_all, bool):
        raise SpecError(f"the network spec {path}: 'catch_all' must be true or false, not {catch_all!r}")
    watched = raw.get("watched", [])
    if not isinstance(watched, list) or not all(_is_port(port) for port in watched):
        raise SpecError(f"the network spec {path}: 'watched' must be a list of ports")
    return Spec(raw["socket"], tuple(forward), proxy_port, catch_all, tuple(watched))


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def ensure_loopback_up() -> None:
    """bwrap brings `lo` up in a new network namespace; should it ever not, bring it up with `ip` if there is one."""
    try:
        with open("/sys/class/net/lo/flags") as handle:
            if int(handle.read().strip(), 16) & 0x1:  # IFF_UP
                return
    except (OSError, ValueError):
        pass  # no sysfs view of this namespace: try anyway
    ip = shutil.which("ip")
    if ip is not None:
        subprocess.run([ip, "link", "set", "lo", "up"], check=False, stdout=subprocess.DEVNULL)


GATE_WAIT_S = 5.0  # agent_exec starts the gate just after the sandbox (off the agent's start-up path)


def _connect_gate(path: str) -> socket.socket:
    """A connection to the gate, waiting up to GATE_WAIT_S for its socket to appear (it is made just after the
    sandbox starts, so an agent's very first connection may come before it)."""
    deadline = time.monotonic() + GATE_WAIT_S
    while True:
        gate = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            gate.connect(path)
            return gate
        except (FileNotFoundError, ConnectionRefusedError):
            gate.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        except OSError:
            gate.close()
            raise


def _forward(client: socket.socket, *, gate_path: str, port: int) -> None:
    """Relay one connection to 127.0.0.1:port through the gate, as a CONNECT it allows or refuses."""
    try:
        gate = _connect_gate(gate_path)
    except OSError:
        client.close()
        return
    try:
        gate.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head, rest = read_head(gate, timeout=_GATE_ANSWER_TIMEOUT)
        status = head.split(b" ", 2)[1:2]
        if status != [b"200"]:
            raise HeadError(f"the gate answered {head[:100]!r}")
        if rest:
            client.sendall(rest)
    except (OSError, HeadError):
        gate.close()
        client.close()  # refused or failed: the client sees its connection closed
        return
    splice(client, gate)


def _proxy(client: socket.socket, *, gate_path: str) -> None:
    """Relay one proxy-port connection raw: the client speaks CONNECT or absolute-form HTTP to the gate itself."""
    try:
        gate = _connect_gate(gate_path)
    except OSError:
        client.close()
        return
    splice(client, gate)


Serve = Callable[[socket.socket], None]


def open_listeners(spec: Spec) -> list[tuple[socket.socket, Serve]]:
    """Bind and listen on 127.0.0.1 for the forwarded ports and the proxy port; raises OSError if a port is taken.

    Sockets first, threads later (`serve_forever`): with the catch-all, capabilities are dropped in between, and
    capabilities belong to a thread, so no thread may be started while they are held.
    """
    listeners: list[tuple[socket.socket, Serve]] = []
    for port in spec.forward:
        serve = functools.partial(_forward, gate_path=spec.socket, port=port)
        listeners.append((socket.create_server(("127.0.0.1", port), backlog=64), serve))
    if spec.proxy_port is not None:
        serve = functools.partial(_proxy, gate_path=spec.socket)
        listeners.append((socket.create_server(("127.0.0.1", spec.proxy_port), backlog=64), serve))
    return listeners


def serve_forever(listener: socket.socket, serve: Serve) -> None:
    """Accept connections in a daemon thread, serving each in a daemon thread of its own (they share nothing)."""

    def accept_loop() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # out of descriptors, say: wait for relays to end rather than spin
                time.sleep(0.1)
                continue
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    threading.Thread(target=accept_loop, name=f"listen-{listener.getsockname()[1]}", daemon=True).start()


def set_up_network(spec: Spec) -> None:
    """Loopback up, listeners bound, the catch-all installed and capabilities dropped if asked, then serving."""
    ensure_loopback_up()
    listeners = open_listeners(spec)
    if spec.catch_all:
        catcher = catchall.open_listener()
        catchall.install_rules(catcher.getsockname()[1], spec.watched)
        catchall.drop_capabilities()
        listeners.append((catcher, functools.partial(catchall.report, gate_path=spec.socket)))
    for listener, serve in listeners:
        serve_forever(listener, serve)


def run_child(argv: list[str]) -> int:
    """Run argv with inherited stdio, forwarding SIGTERM/SIGINT/SIGHUP to it; its exit status (128+N: signal N)."""
    child: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, frame: object) -> None:
        # Handlers run in the main thread between bytecodes: a signal that comes before Popen has returned is kept
        # in `pending` and sent right after, so none is lost.
        if child:
            child[0].send_signal(signum)
        else:
            pending.append(signum)

    for signum in _FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    try:
        child.append(subprocess.Popen(argv))
    except OSError as exc:
        print(f"[taskgate sandbox] could not start {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    for signum in pending:
        child[0].send_signal(signum)
    code = child[0].wait()
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    """The command line: SPECFILE -- ARGV…"""
    if len(argv) < 3 or argv[1] != "--":
        print(
            "[taskgate sandbox] usage: python -m taskgate.infrastructure.sandbox.inside SPECFILE -- ARGV...",
            file=sys.stderr,
        )
        return CANNOT_START
    try:
        spec = load_spec(argv[0])
        set_up_network(spec)
    except SpecError as exc:
        print(f"[taskgate sandbox] {exc}", file=sys.stderr, flush=True)
        return CANNOT_START
    except (OSError, CatchAllError) as exc:
        print(f"[taskgate sandbox] cannot set up the sandbox's network: {exc}", file=sys.stderr, flush=True)
        return CANNOT_START
    return run_child(argv[2:])


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # not sys.exit: daemon relay threads may be inside blocking calls; nothing is left to clean up
