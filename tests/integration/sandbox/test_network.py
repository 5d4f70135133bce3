"""The sandbox's network end to end with the real bubblewrap: the gate on the host, `inside` in the namespace.

Never skipped in CI (which installs bwrap); elsewhere skipped, saying how to install it (tests/support/sandbox.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskgate.infrastructure.sandbox.egress import EgressGate
from tests.support.net_servers import RecordingHttp, tcp_server
from tests.support.sandbox import require_bwrap

PROXY_PORT = 3128
CHECKOUT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bwrap() -> str:
    return require_bwrap()


@pytest.fixture
def servers() -> Iterator[tuple[RecordingHttp, int, int, int]]:
    """Three host HTTP servers on loopback: allowed and forwarded, not forwarded, forwarded but not allowed."""
    handler = RecordingHttp()
    with tcp_server(handler) as allowed, tcp_server(handler) as unlisted, tcp_server(handler) as not_allowed:
        yield handler, allowed, unlisted, not_allowed


def sandboxed(bwrap: str, folder: Path, forward: list[int], script: str, catch_all: bool = False) -> list[str]:
    """The argv of `inside` in a bwrap sandbox without a network of its own, running `python -c script`."""
    spec = folder / "spec.json"
    fields = {"socket": str(folder / "egress.sock"), "forward": forward, "proxy_port": PROXY_PORT}
    spec.write_text(json.dumps({**fields, "catch_all": catch_all}))
    return [
        *(bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"),
        # this checkout and its venv shown again: a fresh clone (and CI's) may lie under /tmp
        *("--ro-bind", str(CHECKOUT), str(CHECKOUT), "--ro-bind", sys.prefix, sys.prefix),
        *("--bind", str(folder), str(folder), "--unshare-net", "--unshare-pid", "--die-with-parent"),
        *(("--cap-add", "CAP_NET_ADMIN") if catch_all else ()),
        "--",
        *(sys.executable, "-m", "taskgate.infrastructure.sandbox.inside", str(spec), "--"),
        *(sys.executable, "-c", textwrap.dedent(script)),
    ]


def start_gate(folder: Path, allow: list[str]) -> EgressGate:
    gate = EgressGate(str(folder / "egress.sock"), allow, str(folder / "refusals.jsonl"), agent="agent-1")
    gate.start()
    return gate


def refusals(folder: Path) -> list[dict]:
    path = folder / "refusals.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


PROBE = """
    import json, socket, urllib.request

    def attempt(port, request=b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n", host="127.0.0.1"):
        try:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(request)
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
                return data.decode()
        except OSError as exc:
            return type(exc).__name__

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    print(json.dumps({
        "allowed": direct.open("http://127.0.0.1:ALLOWED/hi", timeout=10).read().decode(),
        "unlisted": attempt(UNLISTED),
        "not_allowed": attempt(NOT_ALLOWED),
        "outside": attempt(80, host="1.1.1.1"),
        "proxy_refused": attempt(PROXY, b"CONNECT evil.test:443 HTTP/1.1\\r\\nHost: evil.test:443\\r\\n\\r\\n"),
        "proxy_allowed": attempt(
            PROXY, b"CONNECT 127.0.0.1:ALLOWED HTTP/1.1\\r\\n\\r\\nGET /tunnel HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
        ),
    }))
"""


def test_the_agent_reaches_exactly_its_allow_list(bwrap: str, tmp_path: Path, servers) -> None:
    handler, allowed, unlisted, not_allowed = servers
    gate = start_gate(tmp_path, [f"127.0.0.1:{allowed}"])
    script = PROBE.replace("NOT_ALLOWED", str(not_allowed)).replace("UNLISTED", str(unlisted))
    script = script.replace("ALLOWED", str(allowed)).replace("PROXY", str(PROXY_PORT))
    try:
        done = subprocess.run(
            sandboxed(bwrap, tmp_path, [allowed, not_allowed], script), capture_output=True, text=True, timeout=60
        )
    finally:
        gate.close()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["allowed"] == f"hello from {allowed}"  # the same loopback URL as on the host
    assert seen["unlisted"] == "ConnectionRefusedError"
    assert seen["not_allowed"] in ("", "ConnectionResetError")  # the gate refused: the connection is closed
    assert seen["outside"] in ("OSError", "ConnectionRefusedError")  # no route out of the namespace
    assert seen["proxy_refused"].startswith("HTTP/1.1 403 Forbidden")
    assert "evil.test:443 is not on this agent's network allow-list" in seen["proxy_refused"]
    assert seen["proxy_allowed"].startswith("HTTP/1.1 200 Connection established")
    assert seen["proxy_allowed"].endswith(f"hello from {allowed}")
    assert [head.split(b"\r\n")[0] for head in handler.heads] == [b"GET /hi HTTP/1.1", b"GET /tunnel HTTP/1.1"]
    lines = refusals(tmp_path)
    assert sorted((line["target"], line["source"], line["agent"]) for line in lines) == [
        (f"127.0.0.1:{not_allowed}", "proxy", "agent-1"),
        ("evil.test:443", "proxy", "agent-1"),
    ]


CAUGHT = """
    import json, socket, subprocess, urllib.request

    def attempt(host, port):
        try:
            with socket.create_connection((host, port), timeout=10) as sock:
                return sock.recv(100).decode()
        except OSError as exc:
            return type(exc).__name__

    own = socket.create_server(("127.0.0.1", 0))  # the agent's own test server keeps working
    client = socket.create_connection(own.getsockname(), timeout=10)
    own.accept()[0].sendall(b"mine")
    nft = subprocess.run(["nft", "flush", "ruleset"], capture_output=True, text=True)
    status = dict(line.split(":\t") for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    print(json.dumps({
        "outside": [attempt("10.1.2.3", 443), attempt("1.1.1.1", 80)],
        "own_server": client.recv(10).decode(),
        "allowed": urllib.request.build_opener(urllib.request.ProxyHandler({}))
        .open("http://127.0.0.1:ALLOWED/", timeout=10).read().decode(),
        "nft_flush": nft.returncode,
        "caps": [status["CapEff"], status["CapPrm"], status["CapBnd"], status["CapAmb"]],
    }))
"""


def test_the_catch_all_records_connects_outside_and_the_agent_has_no_capabilities(
    bwrap: str, tmp_path: Path, servers
) -> None:
    _, allowed, _, _ = servers
    gate = start_gate(tmp_path, [f"127.0.0.1:{allowed}"])
    script = CAUGHT.replace("ALLOWED", str(allowed))
    try:
        command = sandboxed(bwrap, tmp_path, [allowed], script, catch_all=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        gate.close()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["outside"] == ["", ""]  # closed at once by the catch-all
    assert seen["own_server"] == "mine"
    assert seen["allowed"] == f"hello from {allowed}"
    assert seen["nft_flush"] != 0
    assert seen["caps"] == ["0000000000000000"] * 4
    lines = refusals(tmp_path)
    assert [(line["target"], line["source"]) for line in lines] == [
        ("10.1.2.3:443", "catch-all"),
        ("1.1.1.1:80", "catch-all"),
    ]


def test_the_agents_exit_status_is_relayed(bwrap: str, tmp_path: Path) -> None:
    gate = start_gate(tmp_path, [])
    try:
        done = subprocess.run(sandboxed(bwrap, tmp_path, [], "raise SystemExit(7)"), timeout=60)
        killed = subprocess.run(
            sandboxed(bwrap, tmp_path, [], "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), timeout=60
        )
    finally:
        gate.close()
    assert done.returncode == 7
    assert killed.returncode == 128 + signal.SIGKILL


def test_sigterm_to_inside_reaches_the_agent(bwrap: str, tmp_path: Path) -> None:
    script = """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (print("agent got SIGTERM", flush=True), sys.exit(42)))
        print("ready", flush=True)
        time.sleep(60)
    """
    gate = start_gate(tmp_path, [])
    process = subprocess.Popen(sandboxed(bwrap, tmp_path, [], script), stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        os.kill(inside_pid(tmp_path / "spec.json"), signal.SIGTERM)
        assert process.stdout.readline() == "agent got SIGTERM\n"
        assert process.wait(timeout=30) == 42
    finally:
        process.kill()
        process.wait()
        gate.close()


def inside_pid(spec: Path) -> int:
    """The host's process id of the `inside` process started with this spec file (it is not bwrap's own child)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            # argv[1:4], not anywhere: bwrap's own argv (and its init's in the namespace) holds the same words
            if argv[1:4] == [b"-m", b"taskgate.infrastructure.sandbox.inside", str(spec).encode()]:
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"no inside process for {spec}")


@pytest.mark.parametrize(
    "spec_text",
    [None, "{not json", '{"socket": 1}', '{"socket": "/s", "forward": [0]}', '{"socket": "/s", "catch_all": 1}'],
)
def test_a_missing_or_malformed_spec_is_126_with_a_clear_error(tmp_path: Path, spec_text: str | None) -> None:
    spec = tmp_path / "spec.json"
    if spec_text is not None:
        spec.write_text(spec_text)
    command = [sys.executable, "-m", "taskgate.infrastructure.sandbox.inside", str(spec), "--", "true"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 126
    assert done.stderr.startswith("[taskgate sandbox] ") and str(spec) in done.stderr
