"""The network gate's host side: a real Unix socket, real local TCP servers, the real refusals file."""

from __future__ import annotations

import datetime
import json
import re
import socket
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from taskgate.infrastructure.sandbox.egress import EgressGate, is_allowed, parse_allow
from tests.support.net_servers import RecordingHttp, echo, recv_all, recv_head, tcp_server


@pytest.fixture
def make_gate(tmp_path: Path) -> Iterator:
    gates: list[EgressGate] = []

    def make(allow: list[str]) -> EgressGate:
        gate = EgressGate(str(tmp_path / f"egress{len(gates)}.sock"), allow, str(tmp_path / "refusals.jsonl"), "a1")
        gate.start()
        gates.append(gate)
        return gate

    yield make
    for gate in gates:
        gate.close()


def ask(gate: EgressGate, request: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(gate.socket_path)
    sock.sendall(request)
    return sock


def refusals(gate: EgressGate) -> list[dict]:
    path = Path(gate.refusals_path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_allowed_connect_is_spliced_to_the_target(make_gate) -> None:
    with tcp_server(echo) as port:
        gate = make_gate([f"127.0.0.1:{port}"])
        sock = ask(gate, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nearly bytes|".encode())
        head, rest = recv_head(sock)
        assert head == b"HTTP/1.1 200 Connection established"
        big = b"x" * 1_000_000  # more than the socket buffers hold: both directions must flow at once
        sock.sendall(big)
        sock.shutdown(socket.SHUT_WR)
        assert rest + recv_all(sock) == b"early bytes|" + big
    assert refusals(gate) == []
    assert stat.S_IMODE(Path(gate.socket_path).stat().st_mode) == 0o600


def test_a_refused_connect_gets_403_and_one_refusal_line(make_gate) -> None:
    gate = make_gate(["example.com:443"])
    before = datetime.datetime.now(datetime.UTC)
    answer = recv_all(ask(gate, b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"evil.test:443 is not on this agent's network allow-list" in answer
    [line] = refusals(gate)
    at = line.pop("at")
    assert line == {
        "what": "connect",
        "target": "evil.test:443",
        "source": "proxy",
        "agent": "a1",
        "reason": "not on the allow-list",
    }
    assert before <= datetime.datetime.fromisoformat(at) <= datetime.datetime.now(datetime.UTC)


def test_an_absolute_form_get_is_forwarded_in_origin_form(make_gate) -> None:
    server = RecordingHttp()
    with tcp_server(server) as port:
        gate = make_gate([f"127.0.0.1:{port}"])
        request = (
            f"GET http://127.0.0.1:{port}/path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nX-Kept: yes\r\n\r\n"
        )
        answer = recv_all(ask(gate, request.encode()))
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(f"hello from {port}".encode())
    [head] = server.heads
    lines = head.decode().split("\r\n")
    assert lines[0] == "GET /path?q=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}" in lines and "X-Kept: yes" in lines and "Connection: close" in lines
    assert not [line for line in lines if line.lower().startswith("proxy-")]


def test_an_absolute_form_get_to_a_host_not_listed_is_refused(make_gate) -> None:
    gate = make_gate(["127.0.0.1:1"])
    answer = recv_all(ask(gate, b"GET http://other.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 403")
    assert [line["target"] for line in refusals(gate)] == ["other.test:80"]


def test_an_unreachable_allowed_target_is_502_and_no_refusal(make_gate) -> None:
    with tcp_server(echo) as port:
        pass  # the port is free again: nothing listens on it
    gate = make_gate([f"127.0.0.1:{port}"])
    answer = recv_all(ask(gate, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()))
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert refusals(gate) == []


@pytest.mark.parametrize(
    "request_head",
    [
        b"HELLO\r\n\r\n",
        b"CONNECT nohost HTTP/1.1\r\n\r\n",
        b"CONNECT a:99999 HTTP/1.1\r\n\r\n",
        b"GET /x HTTP/1.1\r\n\r\n",
    ],
)
def test_a_malformed_request_is_400(make_gate, request_head: bytes) -> None:
    gate = make_gate(["a:1"])
    assert recv_all(ask(gate, request_head)).startswith(b"HTTP/1.1 400 Bad Request")
    assert refusals(gate) == []


def test_a_head_longer_than_16_kib_is_400(make_gate) -> None:
    gate = make_gate(["a:1"])
    sock = ask(gate, b"CONNECT a:1 HTTP/1.1\r\nX: " + b"y" * 20_000)
    assert recv_all(sock).startswith(b"HTTP/1.1 400")


def test_wildcard_hosts_and_ports() -> None:
    allow = parse_allow(["*.example.com:443", "API.test:*"])
    assert is_allowed(allow, "a.example.com", 443)
    assert is_allowed(allow, "a.b.EXAMPLE.com.", 443)
    assert not is_allowed(allow, "example.com", 443)
    assert not is_allowed(allow, "badexample.com", 443)
    assert not is_allowed(allow, "a.example.com", 80)
    assert is_allowed(allow, "api.test", 1) and is_allowed(allow, "api.test", 65535)
    assert not is_allowed(allow, "x.api.test", 1)


def test_a_wildcard_entry_lets_the_gate_splice(make_gate) -> None:
    with tcp_server(echo) as port:
        gate = make_gate(["*.localhost:1", "127.0.0.1:*"])
        sock = ask(gate, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        assert recv_head(sock)[0] == b"HTTP/1.1 200 Connection established"
        sock.sendall(b"ping")
        sock.shutdown(socket.SHUT_WR)
        assert recv_all(sock) == b"ping"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("example.com", "has no port"),
        ("example.com:", "is not '*' or a number"),
        ("example.com:0", "is not '*' or a number"),
        ("example.com:65536", "is not '*' or a number"),
        ("example.com:https", "is not '*' or a number"),
        (":443", "has no port"),
        ("a.*.com:443", "is not a host name"),
        ("*:443", "is not a host name"),
        ("ex ample.com:443", "is not a host name"),
    ],
)
def test_a_bad_allow_entry_is_a_value_error_naming_it(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)) as raised:
        parse_allow(["good.test:1", entry])
    assert repr(entry) in str(raised.value)


def test_many_concurrent_refusals_are_as_many_whole_lines(make_gate) -> None:
    gate = make_gate([])
    count = 60

    def refused(index: int) -> bytes:
        target = f"host{index}.{'x' * 3000}.test:443"  # long lines: a torn write would show
        return recv_all(ask(gate, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode()))

    with ThreadPoolExecutor(max_workers=count) as pool:
        answers = list(pool.map(refused, range(count)))
    assert all(answer.startswith(b"HTTP/1.1 403") for answer in answers)
    lines = refusals(gate)  # json.loads of every line: each is whole
    assert sorted(line["target"].split(".")[0] for line in lines) == sorted(f"host{i}" for i in range(count))


def test_a_catch_all_report_becomes_a_refusal_line(make_gate) -> None:
    gate = make_gate(["10.1.2.3:443"])
    answer = recv_all(ask(gate, b"REFUSED 10.1.2.3:22 HTTP/1.1\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 403")
    [line] = refusals(gate)
    assert (line["target"], line["source"]) == ("10.1.2.3:22", "catch-all")


def test_close_unlinks_the_socket(tmp_path: Path) -> None:
    gate = EgressGate(str(tmp_path / "g.sock"), [], str(tmp_path / "r.jsonl"))
    gate.start()
    gate.close()
    assert not (tmp_path / "g.sock").exists()
