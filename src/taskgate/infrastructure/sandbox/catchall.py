"""The sandbox's catch-all (spec `"catch_all": true`): record every TCP connect that leaves the loopback.

Used by `inside`, as root inside the sandbox's network namespace with CAP_NET_ADMIN (bwrap `--cap-add
CAP_NET_ADMIN`; docs/design/sandbox.md, §3). A default route through `lo` lets a connect to any address leave
the socket layer, and an nftables rule redirects every TCP connect to an address outside 127.0.0.0/8 to the
catch-all listener. That listener reads the original destination (SO_ORIGINAL_DST), reports it to the network
gate as a `REFUSED host:port` pseudo-request (the gate writes the refusal line: from in here there is no access
to the refusals file) and closes the connection. Loopback destinations are left alone: the agent's own test
servers on 127.0.0.1 must keep working, and a loopback port nobody listens on is refused by the kernel anyway;
except the `watched` ports: those the host listened on when the agent started (its database, the operator's dev
servers), not on the allow-list. A connect to them inside is caught and recorded too.

Then `drop_capabilities` takes every capability away (ambient, bounding set, effective/permitted/inheritable)
before the agent is started, so that the agent cannot flush the rules. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess

from taskgate.infrastructure.sandbox.relay import HeadError, read_head

_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h, at level SOL_IP
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class CatchAllError(Exception):
    """The catch-all could not be set up (no `ip` or `nft`, no CAP_NET_ADMIN, no nat support)."""


def open_listener() -> socket.socket:
    """The catch-all's listening socket on 127.0.0.1, on a port the kernel picks (no clash with the agent's)."""
    return socket.create_server(("127.0.0.1", 0), backlog=64)


def install_rules(catch_port: int, watched: tuple[int, ...] = ()) -> None:
    """Route every address through `lo` and redirect TCP connects outside 127.0.0.0/8, and to the `watched`
    loopback ports, to the catch-all port."""
    loopback = ""
    if watched:
        ports = ", ".join(str(port) for port in sorted(set(watched)))
        loopback = f"    meta l4proto tcp ip daddr 127.0.0.0/8 tcp dport {{ {ports} }} redirect to :{catch_port}\n"
    ruleset = (
        "table ip taskgate_catch_all {\n"
        "  chain output {\n"
        "    type nat hook output priority -100; policy accept;\n"
        f"    meta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :{catch_port}\n"
        f"{loopback}"
        "  }\n"
        "}\n"
    )
    # src 127.0.0.1: without it a connect picks 0.0.0.0 as its source, and the catch-all's close never reaches it
    _run(["ip", "route", "add", "default", "dev", "lo", "src", "127.0.0.1"])
    _run(["nft", "-f", "-"], ruleset)


def _run(argv: list[str], stdin: str = "") -> None:
    path = shutil.which(argv[0]) or shutil.which(argv[0], path="/usr/sbin:/sbin")
    if path is None:
        raise CatchAllError(f"the catch-all needs `{argv[0]}`, which is not installed")
    done = subprocess.run([path, *argv[1:]], input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CatchAllError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")


def original_destination(client: socket.socket) -> str:
    """The `host:port` the redirected connection was meant for (from the connection-tracking entry)."""
    raw = client.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)  # a struct sockaddr_in
    (port,) = struct.unpack("!H", raw[2:4])
    return f"{socket.inet_ntoa(raw[4:8])}:{port}"


def report(client: socket.socket, gate_path: str) -> None:
    """Serve one caught connection: report its destination to the gate as refused, then close it."""
    try:
        target = original_destination(client)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gate:
            gate.connect(gate_path)
            gate.sendall(f"REFUSED {target} HTTP/1.1\r\n\r\n".encode())
            read_head(gate)  # the gate's 403: it has written the line
    except (OSError, HeadError):
        pass  # nothing more to do: the agent's connection is closed either way
    finally:
        client.close()


def drop_capabilities() -> None:
    """Drop every capability of the calling thread for good (the agent is forked from it, so it has none either).

    Order matters: the bounding set can only be shrunk while CAP_SETPCAP is still effective, and only an empty
    bounding set keeps a process running as uid 0 from regaining capabilities when it executes a program.
    """
    import ctypes  # here, not at the top: only the catch-all needs it, and `inside` starts with every agent

    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise CatchAllError(f"could not {what}: {os.strerror(ctypes.get_errno())}")

    check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear the ambient capabilities")
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap} from the bounding set")
    header = struct.pack("Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(2 * 3 * 4)  # two {effective, permitted, inheritable} u32 triples, all empty
    check(libc.capset(header, data), "clear the capability sets")
