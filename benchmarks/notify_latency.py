"""Notification latency: seconds from an event committed to the events log to the message received, per channel
(a real SMTP server, aiosmtpd; a real HTTP receiver, Apprise's json://), next to a same-run baseline: the bare
Apprise send of the same message to the same channel (what any notifier built on Apprise pays at the least).

taskgate's notifier runs as `serve` runs it (`Notifier.run`, under this node's `notify` lease, on a SQLite file
migrated by Alembic), with `batch_s = 0` and `interval_s` as given (default 0.1): the figure is then the poll
wait (uniform in 0..interval_s: each event is written at a random phase of the rounds), one collect
transaction, one read, the send and the `sent` commit. With the defaults (`batch_s = 10`, `interval_s = 2`) a
lone event waits for its batch on purpose: about batch_s + up to interval_s more. Rounds alternate ours and the
baseline so both see the same machine.

Run:  .venv/bin/python benchmarks/notify_latency.py [--n 20] [--interval 0.1] [--batch 0]   (~10 s)
      .venv/bin/python benchmarks/notify_latency.py --n 5 --interval 2 --batch 10         (the defaults, ~2.5 min)
"""

from __future__ import annotations

import argparse
import asyncio
import email
import json
import os
import platform
import random
import socket
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench_support import emit_row


class Arrivals:
    """Receive times (monotonic) of messages, by a marker found in their text."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.changed = threading.Condition()

    def saw(self, text: str) -> None:
        now = time.monotonic()
        with self.changed:
            for word in text.split():
                if word.startswith("mark-"):
                    self.at.setdefault(word.rstrip(":,."), now)
            self.changed.notify_all()

    def wait(self, mark: str, timeout_s: float = 30.0) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: mark in self.at, timeout_s):
                raise TimeoutError(f"{mark} never arrived")
            return self.at[mark]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smtp_server(arrivals: Arrivals):
    from aiosmtpd.controller import Controller

    class Handler:
        async def handle_DATA(self, server, session, envelope) -> str:
            message = email.message_from_bytes(envelope.content)
            parts = [p.get_payload(decode=True) or b"" for p in message.walk() if not p.is_multipart()]
            arrivals.saw(" ".join(p.decode(errors="replace") for p in parts).replace("/sessions/", " "))
            return "250 OK"

    port = _free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    url = f"mailto://bench@localhost:{port}?smtp=127.0.0.1&from=bench@example.com&to=op@example.com"
    return controller, url


def http_server(arrivals: Arrivals):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            arrivals.saw(f"{body['title']} {body['message']}".replace("/sessions/", " "))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"json://127.0.0.1:{server.server_address[1]}/hook"


async def measure(
    n: int, interval_s: float, batch_s: float, data_dir: Path
) -> dict[str, tuple[list[float], list[float]]]:
    from taskgate.bootstrap import bootstrap, build_notifier
    from taskgate.infrastructure.apprise_notify import AppriseSender
    from taskgate.infrastructure.settings import NotifySettings, Settings

    arrivals = Arrivals()
    controller, smtp_url = smtp_server(arrivals)
    server, http_url = http_server(arrivals)
    results: dict[str, tuple[list[float], list[float]]] = {}
    try:
        for name, url in (("SMTP", smtp_url), ("HTTP", http_url)):
            notify = NotifySettings(channels=[url], batch_s=batch_s, interval_s=interval_s)
            settings = Settings(data_dir=data_dir / name, notify=notify)
            app = await bootstrap(settings)
            notifier = build_notifier(settings, app)
            assert notifier is not None and app.uow is not None
            stop = asyncio.Event()
            running = asyncio.create_task(notifier.run(stop))
            await asyncio.sleep(interval_s * 3)  # its first round starts the cursor
            ours, bare, sender = [], [], AppriseSender()
            for i in range(n + 2):  # the first two warm Apprise and the database up: not counted
                mark = f"mark-{name}-{i}"
                await asyncio.sleep(random.uniform(0, interval_s))  # no phase lock with the notifier's rounds
                async with app.uow(write=True) as uow:
                    await uow.events.append("question.asked", app.clock.now(), {"kind": "question"}, mark)
                    await uow.commit()
                    written = time.monotonic()
                took = await asyncio.to_thread(arrivals.wait, mark) - written
                base = f"mark-{name}-bare-{i}"
                started = time.monotonic()
                error = await sender.send(url, "taskgate: 1 question", f"- an agent asks a question: /sessions/{base}")
                assert error is None, error
                bare_took = await asyncio.to_thread(arrivals.wait, base) - started
                if i >= 2:
                    ours.append(took)
                    bare.append(bare_took)
            stop.set()
            await running
            await app.close()
            results[name] = (ours, bare)
    finally:
        controller.stop()
        server.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.1, help="[notify] interval_s of the notifier")
    parser.add_argument("--batch", type=float, default=0.0, help="[notify] batch_s (the default config: 10)")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    print(f"notify latency, {time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"n={args.n} per channel, batch_s={args.batch}, interval_s={args.interval}")
    with tempfile.TemporaryDirectory(prefix="taskgate-notify-bench-") as tmp:
        results = asyncio.run(measure(args.n, args.interval, args.batch, Path(tmp)))
    print(f"{'channel':8} {'ours median':>12} {'ours p90':>10} {'ours max':>10} {'bare median':>12} {'bare p90':>10}")
    for name, (ours, bare) in results.items():
        p90 = statistics.quantiles(ours, n=10, method="inclusive")[-1]
        bp90 = statistics.quantiles(bare, n=10, method="inclusive")[-1]
        print(f"{name:8} {statistics.median(ours):>11.3f}s {p90:>9.3f}s {max(ours):>9.3f}s "
              f"{statistics.median(bare):>11.3f}s {bp90:>9.3f}s")  # fmt: skip
        emit_row(f"notify {name}: event written → received", statistics.median(ours), statistics.median(bare), "s",
                 f"≤ batch_s + interval_s ({args.batch + args.interval:g}) + bare")  # fmt: skip
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
