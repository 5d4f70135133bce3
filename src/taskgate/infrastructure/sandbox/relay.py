"""Byte relaying shared by the network gate (host side, `egress`) and the in-sandbox init (`inside`).

Standard library only: `inside` imports this inside the sandbox at every agent start, so it must load fast.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

MAX_HEAD = 16 * 1024  # an HTTP request or response head longer than this is refused (400) or dropped
HEAD_TIMEOUT = 10.0  # seconds to receive a whole head: a client that trickles bytes is cut off
_CHUNK = 64 * 1024


class HeadError(Exception):
    """The peer sent no complete HTTP head in time, or one that is too long."""


def read_head(sock: socket.socket, limit: int = MAX_HEAD, timeout: float = HEAD_TIMEOUT) -> tuple[bytes, bytes]:
    """Read up to the blank line that ends an HTTP head; return (head without the blank line, bytes after it).

    The bytes after it are the start of the body or of the tunnelled stream (a client may send its TLS hello
    without waiting for our 200), and must be passed on. The deadline covers the whole head, not each recv, so a
    peer cannot keep the connection by sending one byte every few seconds. Leaves the socket blocking.
    """
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            if len(data) > limit:
                raise HeadError(f"head longer than {limit} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HeadError("head not received in time")
            sock.settimeout(remaining)
            chunk = sock.recv(_CHUNK)
            if not chunk:
                raise HeadError("connection closed before the end of the head")
            data += chunk
    except TimeoutError as exc:
        raise HeadError("head not received in time") from exc
    finally:
        sock.settimeout(None)
    head, _, rest = data.partition(b"\r\n\r\n")
    if len(head) > limit:
        raise HeadError(f"head longer than {limit} bytes")
    return head, rest


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between two connected sockets until both directions have ended, then close both.

    One thread per direction (this one and a helper): a single thread blocked writing one way could stop reading
    the other way, and two peers that both wait to write would then hang forever. One side's end of stream is
    passed on as a half-close (shutdown SHUT_WR), so a client that sends its request and then closes its writing
    side still receives the whole answer. An error on either side ends both directions.
    """
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
    a.close()
    b.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy source to target until source's end of stream (passed on as a half-close) or an error."""
    try:
        while data := source.recv(_CHUNK):
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:
        # a reset or broken pipe: wake the other direction too, so that the relay ends as a whole
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
