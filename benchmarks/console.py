"""The operator console: the board with 10,000 sessions, its first paint and live latency in a real browser,
memory per live page (issue 43's console row: first paint ≤ 1 s, commit → card ≤ 500 ms at 10,000 sessions).

On a fresh git repository set up with `taskgate init` (SQLite, or PostgreSQL with `--postgres`), `--sessions`
sessions (default 10,000) spread over every board column are written straight into the migrated database (tasks and
sessions rows; the board reads nothing else) on a plan of their own, plus one real session started with the CLI;
and a second project, `small`, with 10 sessions spread the same way (the same-run baseline of the first paint). A
real `taskgate serve --http` serves the console.

- **board, server**: `BoardQuery.board` + rendering board.html in-process (median of --runs), and a signed-in
  HTTP GET / round trip on loopback. Baseline in the same run: `SessionService.list_sessions` of the same project
  (one query of every session, no cards, no rendering).
- **board, browser**: first contentful paint of / in Debian's Chromium (Playwright), median of 5 loads. Baseline in
  the same run: the first paint of the `small` project's board (10 sessions), same server, same browser.
- **transition → card moved**: the real session is suspended and resumed from this process (its own connection
  to the same database) --moves times; the time from the commit returning to the card showing in its new column of
  an open board (a MutationObserver in the page, wall clocks of the same machine). Median and p99. Baseline in the
  same run: one fetch of the board's live part from that page (what each update costs after the feed noticed).
- **memory**: the server's RSS with 50 open live connections (server-sent event streams of signed-in pages)
  against the same server idle and signed in (ratio), and that each of the 50 streams was told of a change.

Each run prints the issue's two figures as `ROW|…` lines (`bench_support.emit_row`): first paint at --sessions
against the 10-session board (goal ≤ 1000 ms on ours), commit → card against one live fetch (goal ≤ 500 ms).

Run:  .venv/bin/python benchmarks/console.py [--sessions 10000] [--runs 20] [--moves 40] [--repeat 3] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2 as httpx  # the HTTP client the MCP SDK brings
from bench_support import emit_row, git_repo, reset_pg_schema
from sqlalchemy import func, insert, select

from taskgate.application.board import BoardQuery
from taskgate.application.sessions.commands import FireTrigger
from taskgate.bootstrap import bootstrap, load_settings
from taskgate.entrypoints.console.web import Console
from taskgate.infrastructure.db import tables as t

TASKGATE = str(Path(sys.executable).with_name("taskgate"))
PG_BOARD_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/taskgate_bench_board"
"""`--postgres`' database (its schema `public` is dropped and recreated at each run)."""
SMALL = 10  # sessions of the baseline board (project `small`)
STATES = ["ready", "planning", "executing", "verifying", "awaiting_merge", "failed", "suspended", "completed",
          "cancelled"]  # fmt: skip


def cli(repo: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([TASKGATE, *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"taskgate {' '.join(args)} failed: {done.stderr}")
    return done.stdout


fresh_repo = git_repo


async def seed_sessions(repo: Path, count: int) -> None:
    """`count` tasks with a session each on the newest plan of the project, states round-robin over STATES, in one
    transaction; and project `small` with SMALL of them (the baseline board)."""
    os.chdir(repo)
    app = await bootstrap(load_settings())
    try:
        assert app.database is not None
        async with app.database.connect() as conn:
            project_id = (await conn.execute(select(t.projects.c.id))).scalar_one()
            # the seeded sessions go to the newest plan ("Backlog"): the moving one's plan stays under its WIP limit
            plan_id = (await conn.execute(select(func.max(t.plans.c.id)))).scalar_one()
        small = await app.tracker.init_project(str(git_repo(repo.parent / "small")), "small")
        small_plan = await app.tracker.add_plan(small.id, "Phase 1")
        tasks, sessions = rows(project_id, plan_id, "BENCH", count)
        small_tasks, small_sessions = rows(small.id, small_plan.id, "SMALL", SMALL)
        conn = await app.database.open(write=True)
        try:
            await conn.execute(insert(t.tasks), tasks + small_tasks)
            await conn.execute(insert(t.sessions), sessions + small_sessions)
            await conn.commit()
        finally:
            await conn.close()
    finally:
        await app.close()


def rows(project_id: int, plan_id: int, prefix: str, count: int) -> tuple[list[dict], list[dict]]:
    """Rows of `count` tasks and their sessions, states round-robin over STATES, a minute apart."""
    now = datetime.now(UTC)
    tasks, sessions = [], []
    for n in range(count):
        at = now - timedelta(minutes=count - n)
        task_id = f"{prefix}-{n + 1000}"
        state = STATES[n % len(STATES)]
        tasks.append({"id": task_id, "project_id": project_id, "plan_id": plan_id, "title": f"Task number {n}",
                      "description": "", "priority": 2, "status": "open", "created_at": at,
                      "source": "builtin"})  # fmt: skip
        sessions.append({"id": str(uuid.uuid4()), "task_id": task_id, "project_id": project_id,
                         "plan_id": plan_id, "operator_id": "alice", "state": state, "prior_state": None,
                         "state_data": {}, "workflow_stack": [], "version": 5, "created_at": at,
                         "updated_at": at + timedelta(seconds=30)})  # fmt: skip
    return tasks, sessions


async def board_server_times(repo: Path, runs: int) -> tuple[list[float], list[float], int]:
    """Per run: board + render (s), and the baseline list_sessions (s); and the number of cards."""
    os.chdir(repo)
    app = await bootstrap(load_settings())
    try:
        assert app.uow is not None and app.clock is not None
        query = BoardQuery(app.uow, app.sessions, app.clock)
        console = Console(lambda: app)
        project = await app.tracker.resolve_project("bench")
        template = console.templates.get_template("board.html")
        boards, bases, cards = [], [], 0
        for _ in range(runs + 2):  # the first two warm caches and are dropped
            begin = time.perf_counter()
            board = await query.board(project.id)
            template.render(board=board, projects=[project], mark=0, may_start=True, me="alice", csrf="x",
                            flash=[], path="/", asking=set(), page_link=lambda k, n: "/", page_size=50)  # fmt: skip
            boards.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            await app.sessions.list_sessions(project.id)
            bases.append(time.perf_counter() - begin)
            cards = sum(len(c.cards) for c in board.columns)
        return boards[2:], bases[2:], cards
    finally:
        await app.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def signed_in_cookie(url: str, token: str) -> str:
    reply = httpx.post(f"{url}/signin", data={"token": token, "next": "/"}, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    return reply.cookies["taskgate_console"]


def http_board_times(url: str, cookie: str, runs: int) -> list[float]:
    times = []
    with httpx.Client(cookies={"taskgate_console": cookie}) as client:
        for _ in range(runs + 2):
            begin = time.perf_counter()
            assert client.get(f"{url}/").status_code == 200
            times.append(time.perf_counter() - begin)
    return times[2:]


OBSERVE = """sid => {
  window.__moves = [];
  const region = document.getElementById('live');
  let last = null;
  new MutationObserver(() => {
    const here = document.querySelector(`[data-session="${sid}"]`);
    const column = here ? here.closest('[data-column]').dataset.column : null;
    if (column !== last) { last = column; window.__moves.push([column, Date.now()]); }
  }).observe(region, {childList: true, subtree: true});
}"""


async def browser_figures(url: str, token: str, repo: Path, session_id: str, moves: int) -> dict[str, list[float]]:
    from playwright.async_api import async_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Debian's chromium is needed: apt-get install chromium")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.goto(f"{url}/signin")
        await page.fill("#token", token)
        await page.click("button[type=submit]")
        await page.wait_for_selector("#live")
        paints, small_paints = [], []
        for _ in range(5):
            for path, into in (("/?project=bench", paints), ("/?project=small", small_paints)):
                await page.goto(f"{url}{path}")
                await page.wait_for_selector("#live")
                into.append(await first_paint(page))
        await page.goto(f"{url}/?project=bench")
        await page.wait_for_selector("#live")
        fetches = []
        for _ in range(20):
            fetches.append(await page.evaluate("""async () => { const t = performance.now();
                const r = await fetch(location.href, {headers: {'X-Console-Live': '1'}}); await r.text();
                return (performance.now() - t) / 1000; }"""))  # fmt: skip
        await page.evaluate(OBSERVE, session_id)
        latencies = await move_cards(page, repo, session_id, moves)
        await browser.close()
    return {"paint": paints, "small_paint": small_paints, "fetch": fetches, "latency": latencies}


async def first_paint(page) -> float:
    """The page's first contentful paint (s); Chromium records it a little after the DOM is there (polled from here:
    the page's CSP forbids wait_for_function's eval)."""
    entry = "performance.getEntriesByName('first-contentful-paint')"
    while not await page.evaluate(f"{entry}.length"):
        await asyncio.sleep(0.01)
    return await page.evaluate(f"{entry}[0].startTime") / 1000


async def move_cards(page, repo: Path, session_id: str, moves: int) -> list[float]:
    os.chdir(repo)
    app = await bootstrap(load_settings())
    latencies = []
    try:
        for n in range(moves):
            trigger, column = ("suspend", "stopped") if n % 2 == 0 else ("resume", "planning")
            await asyncio.sleep(0.25)  # let the page settle: moves do not queue behind each other
            seen = await page.evaluate("window.__moves.length")
            await app.sessions.fire(FireTrigger(session_id, trigger, "operator:alice", "benchmark"))
            committed = time.time()
            # polled from here (the page's CSP forbids wait_for_function's eval); the time is the observer's own
            while await page.evaluate(f"window.__moves.length <= {seen} || "
                                      f"window.__moves[window.__moves.length - 1][0] !== '{column}'"):  # fmt: skip
                await asyncio.sleep(0.005)
            moved_ms = await page.evaluate("window.__moves[window.__moves.length - 1][1]")
            latencies.append(moved_ms / 1000 - committed)
    finally:
        await app.close()
    return latencies


async def memory_figures(url: str, cookie: str, pid: int, repo: Path, session_id: str, streams: int) -> tuple:
    idle = rss_kib(pid)
    told = 0

    async def listen(client: httpx.AsyncClient, ready: asyncio.Event, changed: asyncio.Event) -> None:
        nonlocal told
        async with client.stream("GET", f"{url}/events") as reply:
            ready.set()
            async for line in reply.aiter_lines():
                if line.startswith("event: changed"):
                    told += 1
                    changed.set()
                    return

    async with httpx.AsyncClient(cookies={"taskgate_console": cookie}, timeout=60) as client:
        readies = [asyncio.Event() for _ in range(streams)]
        changes = [asyncio.Event() for _ in range(streams)]
        tasks = [asyncio.create_task(listen(client, r, c)) for r, c in zip(readies, changes, strict=True)]
        await asyncio.gather(*(r.wait() for r in readies))
        await asyncio.sleep(1.0)
        loaded = rss_kib(pid)
        os.chdir(repo)
        app = await bootstrap(load_settings())
        try:
            await app.sessions.fire(FireTrigger(session_id, "suspend", "operator:alice", "benchmark"))
        finally:
            await app.close()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    return idle, loaded, told


def stats(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--moves", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=1, help="runs, each on a fresh database")
    parser.add_argument("--postgres", nargs="?", const=PG_BOARD_URL, default=None,
                        help=f"run on PostgreSQL (default database: {PG_BOARD_URL}, its schema reset)")  # fmt: skip
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    for n in range(args.repeat):
        print(f"\nrun {n + 1} of {args.repeat}:")
        one_run(args)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def one_run(args: argparse.Namespace) -> None:
    store = "PostgreSQL" if args.postgres else "SQLite"
    root = Path(tempfile.mkdtemp(prefix="taskgate-console-bench-"))
    repo = fresh_repo(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKGATE_")} | {
        "TASKGATE_OPERATOR__DEFAULT": "alice", "TASKGATE_POLICIES__WIP_LIMIT__LIMIT": "1000"}  # fmt: skip
    if args.postgres:
        reset_pg_schema(args.postgres)
        env["TASKGATE_DATABASE_URL"] = args.postgres
    for key in [k for k in os.environ if k.startswith("TASKGATE_")]:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith("TASKGATE_")})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = None
    try:
        cli(repo, env, "init", "--name", "bench")
        cli(repo, env, "plan", "add", "Phase 1")
        cli(repo, env, "task", "add", "The one that moves", "--plan", "1")
        cli(repo, env, "plan", "add", "Backlog")
        session_id = json.loads(cli(repo, env, "session", "start", "BENCH-1", "--json"))["id"]
        asyncio.run(seed_sessions(repo, args.sessions))
        token = json.loads(cli(repo, env, "token", "create", "--operator", "alice", "--json"))["token"]
        boards, bases, cards = asyncio.run(board_server_times(repo, args.runs))
        log = (root / "server.log").open("w")
        server = subprocess.Popen([TASKGATE, "serve", "--http", "--port", str(port)], cwd=repo, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        while "console at" not in (root / "server.log").read_text():
            if server.poll() is not None:
                raise SystemExit(f"taskgate serve ended: {(root / 'server.log').read_text()}")
            time.sleep(0.1)
        cookie = signed_in_cookie(url, token)
        gets = http_board_times(url, cookie, args.runs)
        seen = asyncio.run(browser_figures(url, token, repo, session_id, args.moves))
        idle, loaded, told = asyncio.run(memory_figures(url, cookie, server.pid, repo, session_id, 50))
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(root, ignore_errors=True)

    board_med, board_p99 = stats(boards)
    base_med, _ = stats(bases)
    get_med, get_p99 = stats(gets)
    paint_med, _ = stats(seen["paint"])
    small_med, _ = stats(seen["small_paint"])
    fetch_med, _ = stats(seen["fetch"])
    lat_med, lat_p99 = stats(seen["latency"])
    print(f"board with {cards} cards shown ({args.sessions + 1} sessions), {store}, medians of {args.runs}:")
    print(
        f"  server, query + render       {board_med * 1000:7.1f} ms (p99 {board_p99 * 1000:.1f})   "
        f"baseline list_sessions {base_med * 1000:.1f} ms   ratio {board_med / base_med:.2f}x"
    )
    print(f"  HTTP GET / (signed in)       {get_med * 1000:7.1f} ms (p99 {get_p99 * 1000:.1f})")
    print(
        f"  browser first paint          {paint_med * 1000:7.1f} ms (median of 5 loads, Chromium)   "
        f"baseline: the board of {SMALL} sessions {small_med * 1000:.1f} ms   ratio {paint_med / small_med:.2f}x"
    )
    print(f"transition committed → card moved in an open board, {len(seen['latency'])} moves:")
    print(
        f"  median {lat_med * 1000:.0f} ms, p99 {lat_p99 * 1000:.0f} ms   baseline: one fetch of the live part "
        f"{fetch_med * 1000:.1f} ms   ratio {lat_med / fetch_med:.1f}x (the feed polls every 200 ms)"
    )
    print(
        f"server memory: idle {idle / 1024:.1f} MiB, with 50 live connections {loaded / 1024:.1f} MiB "
        f"(+{(loaded - idle) / 50:.0f} KiB each)   ratio {loaded / idle:.3f}x; {told}/50 streams told of a change"
    )
    emit_row(f"console ({store}): first paint, board of {args.sessions} sessions vs of {SMALL}", paint_med * 1000,
             small_med * 1000, "ms", "≤ 1000 ms")  # fmt: skip
    emit_row(f"console ({store}): commit → card moved at {args.sessions} sessions vs one live fetch",
             lat_med * 1000, fetch_med * 1000, "ms", "≤ 500 ms")  # fmt: skip


if __name__ == "__main__":
    main()
