"""The relay shared by the gate and the in-sandbox init: head reading guards, splicing with half-close."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from taskgate.infrastructure.sandbox.relay import HeadError, read_head, splice


def test_read_head_returns_the_head_and_the_bytes_after_it() -> None:
    a, b = socket.socketpair()
    b.sendall(b"CONNECT x:1 HTTP/1.1\r\nHost: x\r\n\r\nhello")
    assert read_head(a) == (b"CONNECT x:1 HTTP/1.1\r\nHost: x", b"hello")
    a.close()
    b.close()


def test_a_trickled_head_is_cut_off_at_the_deadline() -> None:
    a, b = socket.socketpair()

    def trickle() -> None:
        for _ in range(20):
            b.sendall(b"x")
            time.sleep(0.05)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    started = time.monotonic()
    with pytest.raises(HeadError, match="in time"):
        read_head(a, timeout=0.3)
    assert time.monotonic() - started < 0.8  # the deadline is for the whole head, not for each byte
    trickler.join()
    a.close()
    b.close()


def test_a_head_over_the_limit_is_refused() -> None:
    a, b = socket.socketpair()
    b.sendall(b"x" * 200 + b"\r\n\r\n")
    with pytest.raises(HeadError, match="longer than 100"):
        read_head(a, limit=100)
    a.close()
    b.close()


def test_splice_passes_a_half_close_on_and_closes_both() -> None:
    client, near = socket.socketpair()
    far, server = socket.socketpair()
    relay = threading.Thread(target=splice, args=(near, far), daemon=True)
    relay.start()
    client.sendall(b"request")
    client.shutdown(socket.SHUT_WR)
    assert server.recv(100) == b"request" and server.recv(100) == b""  # the end of the request arrived
    server.sendall(b"answer")  # and the answer still flows back
    server.close()
    assert client.recv(100) == b"answer" and client.recv(100) == b""
    relay.join(timeout=5)
    assert not relay.is_alive() and near.fileno() == -1 and far.fileno() == -1
    client.close()
