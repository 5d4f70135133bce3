"""A real SMTP server (aiosmtpd) and a real HTTP receiver on 127.0.0.1 for the notification tests."""

from __future__ import annotations

import email
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

SMTP_USER, SMTP_PASSWORD = "taskgate", "smtp-pw-Zq8vR2"


@dataclass
class Mailbox:
    port: int
    messages: list[tuple[float, Message]] = field(default_factory=list)  # (time received, message)
    arrived: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return (f"mailto://{SMTP_USER}:{SMTP_PASSWORD}@localhost:{self.port}?smtp=127.0.0.1"
                "&from=taskgate@example.com&to=operator@example.com")  # fmt: skip

    def bodies(self) -> list[str]:
        found = []
        for _, message in self.messages:
            parts = [p.get_payload(decode=True) or b"" for p in message.walk() if not p.is_multipart()]
            found.append(str(message["Subject"]) + "\n" + "\n".join(p.decode() for p in parts))
        return found


@dataclass
class Receiver:
    url: str
    posts: list[tuple[float, dict]] = field(default_factory=list)
    fail_next: int = 0  # answer 500 to this many requests first
    answered: list[int] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)

    def bodies(self) -> list[str]:
        return [f"{body['title']}\n{body['message']}" for _, body in self.posts]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    box = Mailbox(_free_port())

    class Handler:
        async def handle_DATA(self, server, session, envelope) -> str:
            box.messages.append((time.monotonic(), email.message_from_bytes(envelope.content)))
            box.arrived.set()
            return "250 OK"

    def authenticate(server, session, envelope, mechanism, data) -> AuthResult:
        return AuthResult(success=data.login == SMTP_USER.encode() and data.password == SMTP_PASSWORD.encode())

    controller = Controller(Handler(), hostname="127.0.0.1", port=box.port, authenticator=authenticate,
                            auth_require_tls=False, auth_required=True)  # fmt: skip
    controller.start()
    yield box
    controller.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status = 500 if found.fail_next > 0 else 200
            if status == 200:
                found.posts.append((time.monotonic(), body))
                found.arrived.set()
            else:
                found.fail_next -= 1
            found.answered.append(status)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found.url = f"json://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()
