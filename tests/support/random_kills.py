"""Random-kill fault injection: session lifecycles driven over MCP against a real `taskgate serve --http` that is
SIGKILLed at random moments and started again on the same data (issue 36's figure; `benchmarks/random_kills.py`
prints it, `tests/e2e/test_random_kills.py` keeps a small run of it working).

One run is one deployment (`CrashService`: its own git repository, config and data dir; SQLite in the data dir or a
PostgreSQL database given by URL) and N lifecycles, one after another (or `concurrency` at a time, each lane one
after another), each a session of its own task driven the way an operator drives it: start, execute with a scripted
agent that commits, maybe request changes, maybe main moves so the merge must rebase, then approve and merge, or
reject with auto_revert, or cancel; a `flaky` agent fails its first run so the operator retries. The driver reads
the session's state before every call and does what that state asks for, so after a kill it simply carries on from
wherever the restarted server says the session is.

Kills, drawn per lifecycle from the seeded RNG before it starts (so the plan depends on the seed alone, not on
timing): 0-3 timer kills (SIGKILL of the `serve` process after a random time up; agents and git children live
on), sometimes a named crash point armed for the lifecycle (`TASKGATE_CRASH_AT`, the server kills itself there;
armed again at every restart until it fired), and sometimes a kill during the start-up that follows a kill (while
recovery runs). With lanes, one killer serves them all: a kill is due when any running lifecycle's next timer is,
and it hits every running session.

What is checked:

- **acknowledged writes**: every write call that returned success is recorded with the version and state it
  answered (and the transition row or the decision it made). After every restart that followed a kill, and once
  more at the end, each is looked up in the session's log (`session_history`, decisions in `events_list`):
  a missing or different row is **lost**.
- **stuck**: a session that stops moving (same state and version) for `stuck_after_s` after the last restart
  while the driver keeps making the operator's calls: not terminal and no operator call moves it on.
- **faults**: the work on main twice or not at all after a merge (or on main after a reject or cancel), an
  agent run twice, a worktree or branch left after the session ended, a session that ended other than its
  scenario, a log whose versions have a gap or that disagrees with the session, the server exiting by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskgate.application.sessions.crashpoints import ENV
from tests.e2e.test_crash_points import CrashService
from tests.e2e.test_crash_recovery import connect
from tests.e2e.test_mcp_transports import TASKGATE

TERMINAL = frozenset({"completed", "cancelled"})
WIP_ORDER = ("planning", "executing", "verifying", "awaiting_merge")
POLL_S = 0.1  # between two reads of a session that is waiting for something the server does by itself
LISTEN_TIMEOUT_S = 90.0  # a start-up (migrations, recovery) that takes longer is a failure of the run itself

# Appends a numbered pass to work/<task>.md and commits it ("feat: <task> pass 1", then "fix: <task> pass N"), so
# the work of every agent run shows on main exactly once after a merge. "flaky" exits 3 when given no
# instructions (its first run): the session fails, and the operator's retry (which tells it why) succeeds.
AGENT = """\
import subprocess, sys
from pathlib import Path
task_id, instructions, mode = sys.argv[1:4]
if mode == "flaky" and not instructions:
    print("failing on purpose", flush=True)
    sys.exit(3)
work = Path("work", f"{task_id}.md")
work.parent.mkdir(exist_ok=True)
passes = len(work.read_text().splitlines()) + 1 if work.exists() else 1
first_line = instructions.splitlines()[0] if instructions else "first pass"
with work.open("a") as out:
    out.write(f"- pass {passes}: {first_line}\\n")
identity = ["-c", "user.name=kill agent", "-c", "user.email=agent@taskgate.invalid"]
subprocess.run(["git", *identity, "add", "work"], check=True)
subject = f"{'feat' if passes == 1 else 'fix'}: {task_id} pass {passes}"
subprocess.run(["git", *identity, "commit", "-q", "-m", subject], check=True)
print(subject, flush=True)
"""

COMMON_POINTS = ("start.created", "start.initializing", "start.worktree", "start.ready", "execute.plan_complete",
                 "execute.queued", "agents.ended")  # fmt: skip
ENDING_POINTS = {
    "merge": ("merge.requested", "merge.git_done", "merge.merged", "cleanup.discarded"),
    "reject": ("decide.reject", "compensate.reset", "compensate.rolled_back"),
    "cancel": (),
}


# -- the plan ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One lifecycle's plan, drawn before it starts: what the operator does and where the server is killed."""

    task: str
    agent: str  # worker | flaky (fails its first run: the operator retries)
    request_changes: bool
    ending: str  # merge | reject | cancel
    cancel_in: str | None  # cancel once the session is this far (a WIP state)
    move_main: bool  # commit on main before the merge, so it must rebase
    point: str | None  # a named crash point armed for this lifecycle
    # when each timer kill comes, as a fraction of a lifecycle's time up (the run's median of those no kill cut)
    timers: tuple[float, ...]
    # per restart after a kill: kill it again during its start-up, this fraction of a start-up's time after launch
    startup_kills: tuple[float | None, ...]

    def describe(self) -> str:
        """e.g. `merge + request_changes + main moved; armed merge.git_done, timers at 0.42 0.95`."""
        parts = [self.ending if self.ending != "cancel" else f"cancel in {self.cancel_in}"]
        if self.agent == "flaky":
            parts.append("flaky agent + retry")
        if self.request_changes:
            parts.append("request_changes")
        if self.move_main:
            parts.append("main moved")
        plan = [f"armed {self.point}"] if self.point else []
        if self.timers:
            plan.append(f"timers at {' '.join(f'{t:.2f}' for t in self.timers)}")
        return f"{' + '.join(parts)}; {', '.join(plan) or 'no kill planned'}"


def draw_scenario(rng: random.Random, task: str) -> Scenario:
    """A lifecycle's plan from the run's RNG (the same seed draws the same plans, whatever the timing)."""
    ending = rng.choices(["merge", "reject", "cancel"], [0.6, 0.22, 0.18])[0]
    cancel_in = rng.choice(WIP_ORDER) if ending == "cancel" else None
    agent = "flaky" if rng.random() < 0.25 else "worker"
    request_changes = rng.random() < 0.3
    move_main = ending == "merge" and rng.random() < 0.6
    reaches = WIP_ORDER.index(cancel_in) if cancel_in else len(WIP_ORDER)
    specific = [*ENDING_POINTS[ending]]
    if agent == "flaky" and reaches >= 1:
        specific.append("retry.recorded")
    if request_changes and reaches >= 2:
        specific.append("decide.request_changes")
    common = COMMON_POINTS if reaches >= 1 else COMMON_POINTS[:4]
    point = None
    if rng.random() < 0.5:
        point = rng.choice(specific) if specific and rng.random() < 0.6 else rng.choice(common)
    timers = tuple(rng.uniform(0.02, 1.1) for _ in range(rng.choices([0, 1, 2, 3], [0.2, 0.4, 0.25, 0.15])[0]))
    startup = tuple(rng.uniform(0.2, 1.1) if rng.random() < 0.15 else None for _ in range(len(timers) + 1))
    return Scenario(task, agent, request_changes, ending, cancel_in, move_main, point, timers, startup)


# -- what a run finds ----------------------------------------------------------------------------------------------


@dataclass
class Finding:
    """A lost write, a stuck session or another fault, with what the harness saw of the session."""

    kind: str  # lost | stuck | fault
    task: str
    session_id: str | None
    scenario: str
    what: str
    last_states: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)  # the kills the lifecycle went through, in order


@dataclass
class Report:
    """One database's figures."""

    database: str
    seed: int
    lifecycles: int = 0
    kills: Counter[str] = field(default_factory=Counter)  # timer, start-up, point:<name>
    kill_states: Counter[str] = field(default_factory=Counter)  # the session's last known state at each kill
    acknowledged: int = 0
    checked_after_kill: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # tool errors answered, numbers and ids blanked
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def failed(self) -> bool:
        return bool(self.findings)


@dataclass
class Ack:
    """A write call that returned success: what it answered, to be found in the log after every restart."""

    session_id: str
    tool: str
    version: int
    state: str
    generation: int  # the server process (counted from 1) that answered it
    seq: int | None = None  # the row a fire wrote
    trigger: str | None = None
    decision: str | None = None
    checked_after_kill: bool = False
    lost: bool = False

    def describe(self) -> str:
        extra = f" {self.trigger} row {self.seq}" if self.seq is not None else ""
        extra += f" decision {self.decision}" if self.decision else ""
        return f"{self.tool} answered v{self.version} {self.state}{extra} (server #{self.generation})"


def blank(text: str) -> str:
    """An error message with ids, paths, hashes and numbers blanked, so the same error counts once."""
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
    text = re.sub(r"/\S+", "<path>", text)
    text = re.sub(r"\b[0-9a-f]{7,40}\b", "<hash>", text)
    text = re.sub(r"DEMO-\d+", "DEMO-n", text)
    return re.sub(r"\d+", "N", text)[:300]


# -- the server ----------------------------------------------------------------------------------------------------


class ServerGone(Exception):
    """The server process died (was killed) before answering: the call's outcome is unknown."""


class Unreadable(Exception):
    """A read the harness needs (a session's log, its decisions) was answered with an error."""


class Deployment(CrashService):
    """The crash tests' deployment, plus this harness's agents, a server that can be launched without waiting,
    and the bookkeeping of which server process (generation) answers."""

    def __init__(self, root: Path, database_url: str | None) -> None:
        super().__init__(root, database_url)
        script = root / "kill_agent.py"
        script.write_text(AGENT)
        config = root / "config" / "taskgate.toml"
        for mode in ("worker", "flaky"):
            command = json.dumps([sys.executable, str(script), "{task_id}", "{instructions}", mode])
            config.write_text(config.read_text() + f"\n[agents.{mode}]\ncommand = {command}\n")
        self.generation = 0
        self.armed: str | None = None
        self.after_kill: set[int] = set()  # generations started because the one before was killed
        self.up = asyncio.Event()  # set while a server process listens
        self.launched_at = 0.0
        self.startups: list[float] = []  # seconds from launch to listening, of every start-up not cut short
        self.dead = asyncio.Event()  # the current process's: set once it has ended

    def launch(self, point: str | None = None, *, after_kill: bool = False) -> None:
        """Start `taskgate serve --http` (armed to die at `point`), without waiting for it to listen."""
        assert self.process is None
        self.generation += 1
        if after_kill:
            self.after_kill.add(self.generation)
        self.armed, self.dead = point, asyncio.Event()
        self.up.clear()
        self.launched_at = time.monotonic()
        log = self.root / f"server-{self.generation}.log"
        self.logs.append(log)
        env = {**self.env, ENV: point} if point else self.env
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [TASKGATE, "serve", "--http"], cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=out,
            )  # fmt: skip

    async def listening(self, timeout: float = LISTEN_TIMEOUT_S) -> bool:
        """Until the server listens (True; after its start-up recovery) or its process ends (False).

        Raises: TimeoutError when it does neither within `timeout`."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            with suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                self.up.set()
                self.startups.append(time.monotonic() - self.launched_at)
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(f"taskgate serve did not listen within {timeout:.0f} s: {self.log()[-2000:]}")
            await asyncio.sleep(0.05)
        return False

    def exited(self) -> int | None:
        """The process's exit status once it has ended (a SIGKILL reads -9), else None."""
        return None if self.process is None else self.process.poll()

    def reap(self) -> int:
        """Forget an ended server process; its exit status."""
        assert self.process is not None
        code = self.process.wait(timeout=10)
        self.process = None
        self.up.clear()
        self.dead.set()
        return code

    def kill(self) -> None:
        """SIGKILL the server process only: agents (own process groups) and git children live on."""
        assert self.process is not None
        with suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.reap()

    def shutdown(self) -> None:
        """Stop the server gracefully (SIGTERM), when one runs."""
        if self.process is not None:
            self.stop()
            self.up.clear()
            self.dead.set()

    async def gone(self, dead: asyncio.Event, timeout: float) -> bool:
        """Whether the process whose `dead` event this is has ended, or does within `timeout` (a failed call:
        was it the server dying?)."""
        deadline = time.monotonic() + timeout
        while not dead.is_set() and (dead is not self.dead or self.exited() is None):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


@dataclass
class Reply:
    """A tool call's answer: its structured output, or the error text."""

    ok: bool
    data: dict[str, Any]
    text: str
    generation: int  # the server process that answered


class Caller:
    """MCP calls (operator token, streamable HTTP) to whichever server process is up.

    The SDK client's task group cancels the task that owns it when its server dies, so each connection lives in
    a holder task of its own; a call races the death of the server it was sent to."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self._generation = 0
        self._client: Any = None
        self._holder: asyncio.Task[None] | None = None
        self._release = asyncio.Event()

    async def call(self, tool: str, **arguments: Any) -> Reply:
        """One call. Raises: ServerGone when the server died before answering."""
        dep = self.deployment
        while not dep.up.is_set():  # (a wait that returns may find the server killed and starting again)
            await asyncio.wait_for(dep.up.wait(), LISTEN_TIMEOUT_S * 2)
        dead, generation = dep.dead, dep.generation
        if self._generation != dep.generation or self._client is None:
            try:
                await self._reconnect(generation, dead)
            except ConnectionError as exc:
                return Reply(False, {}, f"transport: {exc}"[:500], generation)
        sent = asyncio.ensure_future(self._client.call_tool(tool, arguments))
        died = asyncio.ensure_future(dead.wait())
        try:
            await asyncio.wait({sent, died}, return_when=asyncio.FIRST_COMPLETED, timeout=120)
        finally:
            died.cancel()
        if sent.done() and not sent.cancelled() and sent.exception() is None:
            result = sent.result()
            text = " ".join(getattr(c, "text", "") for c in result.content)
            text = re.sub(r"^Error executing tool \w+: ", "", text)
            return Reply(not result.is_error, result.structured_content or {}, text, generation)
        sent.cancel()
        with suppress(BaseException):
            await sent
        await self.close()
        if await dep.gone(dead, 2.0):
            raise ServerGone(tool)
        error = leaves(sent.exception()) if sent.done() and not sent.cancelled() else "no answer within 120 s"
        return Reply(False, {}, f"transport: {error}"[:500], generation)

    async def _reconnect(self, generation: int, dead: asyncio.Event) -> None:
        await self.close()
        self._release = asyncio.Event()
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.create_task(self._hold(ready, self._release))
        waiter = asyncio.ensure_future(dead.wait())
        try:
            await asyncio.wait({ready, waiter}, return_when=asyncio.FIRST_COMPLETED, timeout=60)
        finally:
            waiter.cancel()
        if not ready.done() or ready.exception() is not None:
            failure = ready.exception() if ready.done() else TimeoutError("no connection within 60 s")
            ready.cancel()  # the holder, failing later, has nobody to tell
            await self.close()
            if await self.deployment.gone(dead, 2.0):
                raise ServerGone("connect")
            raise ConnectionError(f"cannot connect to the live server: {leaves(failure)}")
        self._client, self._generation = ready.result(), generation

    async def _hold(self, ready: asyncio.Future[Any], release: asyncio.Event) -> None:
        try:
            async with connect(self.deployment) as client:
                ready.set_result(client)
                await release.wait()
        except BaseException as exc:  # the server died under the client: its task group cancels this task
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(repr(exc)))
                ready.exception()  # retrieved here too: the caller may have stopped waiting for it

    async def close(self) -> None:
        """Drop the connection (its holder task ends, whatever state the server is in)."""
        self._client = None
        holder, self._holder = self._holder, None
        if holder is None:
            return
        self._release.set()
        with suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(holder), 5)
        if not holder.done():
            holder.cancel()
            with suppress(BaseException):
                await asyncio.wait_for(holder, 5)


def leaves(exc: BaseException | None) -> str:
    """What actually went wrong inside (nested) exception groups, one `Type: message` per leaf."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(leaves(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


# -- one run -------------------------------------------------------------------------------------------------------


class Pace:
    """This machine's pace, as the run measured it so far: a lifecycle's time when no kill cut it, and a start-up's
    (medians; first guesses before any was measured). The plans' timers are fractions of these, so that they land
    at the same stages of a lifecycle on a fast machine and on a loaded one."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.lifecycles: list[float] = []

    @property
    def lifecycle(self) -> float:
        return statistics.median(self.lifecycles) if self.lifecycles else 1.0

    @property
    def startup(self) -> float:
        return statistics.median(self.deployment.startups) if self.deployment.startups else 1.5


class Run:
    """N lifecycles on one deployment, `concurrency` at a time, killed as their scenarios say; `report` holds what
    was found."""

    def __init__(self, root: Path, database: str, database_url: str | None, seed: int, *, concurrency: int = 1,
                 stuck_after_s: float = 60.0, say: Callable[[str], None] = print) -> None:  # fmt: skip
        self.deployment = Deployment(root, database_url)
        self.sqlite = database_url is None
        self.rng = random.Random(seed)
        self.concurrency = concurrency
        self.stuck_after_s = stuck_after_s
        self.say = say
        self.report = Report(database, seed)
        self.acks: list[Ack] = []
        self.lifecycles: list[Lifecycle] = []  # started ones, in order
        self.waiting: deque[Lifecycle] = deque()
        self.running: list[Lifecycle] = []
        self.server_turn = asyncio.Lock()  # one kill or restart at a time
        self.up_since = time.monotonic()
        self.pace = Pace(self.deployment)

    async def execute(self, lifecycles: int) -> Report:
        """Seed the deployment, run the lifecycles, then restart once more and check everything again."""
        started = time.monotonic()
        dep = self.deployment
        await asyncio.to_thread(dep.seed)  # project, plan 1, operator alice and her token
        # every plan drawn first, in order: the same seed gives the same plans at any concurrency
        self.waiting.extend(Lifecycle(self, draw_scenario(self.rng, f"DEMO-{i}")) for i in range(1, lifecycles + 1))
        checker = Caller(dep)
        try:
            dep.launch()
            await dep.listening()
            for index in range(1, lifecycles + 1):  # one task per lifecycle: DEMO-1 ...
                added = await checker.call("task_add", title=f"Task {index}", plan_id=1)
                assert added.ok, added.text
            lanes = [asyncio.create_task(self._lane()) for _ in range(min(self.concurrency, lifecycles))]
            try:
                await self._kill_while(lanes, checker)
            finally:
                for lane in lanes:
                    lane.cancel()
                await asyncio.gather(*lanes, return_exceptions=True)
            # the last check: after a plain restart nothing is owed any more and every acknowledged write is there
            dep.shutdown()
            dep.launch()
            if not await dep.listening():
                raise RuntimeError(f"the last restart failed: {dep.log()[-2000:]}")
            await self.verify(checker, self.acks, final=True)
            for lifecycle in self.lifecycles:
                await lifecycle.final_check(checker)
            self._server_tracebacks()
        finally:
            await checker.close()
            dep.shutdown()
            if self.sqlite:  # agent pids are read from the SQLite file; on PostgreSQL they all end by themselves
                dep.kill_agents()
        self.report.seconds = time.monotonic() - started
        return self.report

    async def _lane(self) -> None:
        """Run waiting lifecycles one after another (alone: each on a server armed as its plan says)."""
        dep = self.deployment
        while self.waiting:
            lifecycle = self.waiting.popleft()
            if self.concurrency == 1 and dep.armed != lifecycle.scenario.point:
                async with self.server_turn:  # restarted gracefully, armed for this lifecycle
                    dep.shutdown()
                    dep.launch(lifecycle.scenario.point)
                    if not await dep.listening():  # the armed point reached by start-up recovery
                        self._ended([lifecycle])
                        await self._restart([lifecycle], None)
            self.lifecycles.append(lifecycle)
            self.running.append(lifecycle)
            lifecycle.started = time.monotonic()
            try:
                await lifecycle.drive()
            finally:
                self.running.remove(lifecycle)
                await lifecycle.caller.close()
            self.report.lifecycles += 1
            self.report.outcomes[lifecycle.outcome] += 1
            took, kills = time.monotonic() - lifecycle.started, ", ".join(lifecycle.kills) or "-"
            if not lifecycle.kills and lifecycle.outcome != "stuck":
                self.pace.lifecycles.append(took)
            self.say(f"  {lifecycle.scenario.task:<8} {lifecycle.outcome:<10} {took:5.1f} s  kills: {kills:<40} "
                     f"{lifecycle.scenario.describe()}")  # fmt: skip

    async def _kill_while(self, lanes: list[asyncio.Task[None]], checker: Caller) -> None:
        """Kill the server when a running lifecycle's next timer is due, and notice when it died at its armed
        point, until every lane is done; after each kill restart it and look every acknowledged write up again."""
        dep = self.deployment
        while not all(lane.done() for lane in lanes):
            if failed := [lane for lane in lanes if lane.done() and lane.exception() is not None]:
                raise failed[0].exception()  # type: ignore[misc]
            async with self.server_turn:
                now, code = time.monotonic(), dep.exited()
                due = next((lc for lc in self.running if lc.timers and now - max(lc.started, self.up_since)
                            >= lc.timers[0] * self.pace.lifecycle), None)  # fmt: skip
                if code is not None or due is not None:
                    affected = list(self.running)
                    if code is None and due is not None:
                        due.timers.pop(0)
                        dep.kill()
                        self._killed(affected, "timer")
                    else:
                        due = self._ended(affected)
                    await self._restart(affected, due.startups.pop(0) if due and due.startups else None)
                    owed = [a for a in self.acks if not a.checked_after_kill and not a.lost]
                    with suppress(ServerGone):  # an armed point reached meanwhile: the next restart checks them
                        await self.verify(checker, owed)
                    continue
            await asyncio.wait([lane for lane in lanes if not lane.done()], timeout=0.05)
        for lane in lanes:
            lane.result()

    def _ended(self, affected: list[Lifecycle]) -> Lifecycle | None:
        """The server process ended by itself: killed at its armed point (the lifecycle whose point it was), or a
        fault."""
        dep = self.deployment
        point, code = dep.armed, dep.reap()
        if code == -signal.SIGKILL and point:
            owner = next((lc for lc in affected if lc.pending_point == point), None)
            self._killed(affected, f"point:{point}")
            return owner
        what = f"the server exited by itself with status {code}: {dep.log()[-1500:]}"
        if affected:
            affected[0].fault(what)
        else:
            self.report.findings.append(Finding("fault", "-", None, "", what))
        return None

    def _killed(self, affected: list[Lifecycle], kind: str) -> None:
        self.report.kills[kind] += 1
        if kind.startswith("point:"):
            owner = next((lc for lc in affected if lc.pending_point == kind.removeprefix("point:")), None)
            if owner is not None:
                owner.pending_point = None
        for lifecycle in affected:
            self.report.kill_states[lifecycle.last_state] += 1
            lifecycle.kills.append(kind.removeprefix("point:"))
        if not affected:
            self.report.kill_states["between lifecycles"] += 1

    async def _restart(self, affected: list[Lifecycle], startup_kill: float | None) -> None:
        """Start the server again after a kill, armed with the first running lifecycle's crash point that has not
        fired (its start-up recovery may reach it too); killed once more during its start-up when the plan says
        so."""
        dep = self.deployment
        for _ in range(10):
            point = next((lc.pending_point for lc in affected if lc.pending_point), None)
            dep.launch(point, after_kill=True)
            if startup_kill is None:
                if await dep.listening():
                    self.up_since = time.monotonic()
                    return
                self._ended(affected)
                continue
            with suppress(TimeoutError):
                await dep.listening(timeout=startup_kill * self.pace.startup)
            if dep.exited() is None:
                dep.kill()
                self._killed(affected, "start-up")
            else:
                self._ended(affected)
            startup_kill = None
        raise RuntimeError(f"the server does not start any more: {dep.log()[-2000:]}")

    async def verify(self, caller: Caller, acks: list[Ack], *, final: bool = False) -> None:
        """Look every ack up in its session's log; mark the ones found after a kill, report the lost ones.
        Raises: ServerGone."""
        generation = self.deployment.generation
        by_session: dict[str, list[Ack]] = {}
        for ack in acks:
            by_session.setdefault(ack.session_id, []).append(ack)
        for sid, group in by_session.items():
            owner = next(lc for lc in self.lifecycles if lc.session_id == sid)
            try:
                rows = await history(caller, sid)
                decisions = await decided(caller, sid) if any(a.decision for a in group) else set()
            except Unreadable as exc:  # looked up again at the next restart, or at the end
                if final:
                    owner.fault(f"cannot read the log to check its acknowledged writes: {exc}")
                continue
            versions = [r["session_version"] for r in rows if r["outcome"] == "applied"]
            if versions != list(range(1, len(versions) + 1)):
                owner.fault(f"the applied log's versions have a gap: {versions}", rows)
            for ack in group:
                if ack.lost:
                    continue
                if missing := missing_from(ack, rows, decisions):
                    ack.lost = True
                    owner.finding("lost", missing, rows)
                elif any(ack.generation < g <= generation for g in self.deployment.after_kill):
                    ack.checked_after_kill = True
        if final:
            self.report.acknowledged = len(self.acks)
            self.report.checked_after_kill = sum(a.checked_after_kill for a in self.acks)

    def _server_tracebacks(self) -> None:
        for log in self.deployment.logs:
            text = log.read_text(errors="replace")
            if "Traceback" in text:
                tail = text[text.index("Traceback") :].splitlines()
                last = next((line for line in reversed(tail) if line and not line.startswith(" ")), "")
                self.report.findings.append(Finding("fault", "-", None, "", f"traceback in {log.name}: {last[:300]}"))


# -- one lifecycle ---------------------------------------------------------------------------------------------------


class Lifecycle:
    """Drives one task's session to the end its scenario names, whatever the server did meanwhile."""

    def __init__(self, run: Run, scenario: Scenario) -> None:
        self.run, self.scenario = run, scenario
        self.caller = Caller(run.deployment)
        self.session_id: str | None = None
        self.pending_point = scenario.point  # armed at every restart until it fired
        self.timers = list(scenario.timers)  # the timer kills still to come
        self.startups = list(scenario.startup_kills)
        self.started = time.monotonic()
        self.last_state = "not started yet"
        self.errors: list[str] = []
        self.kills: list[str] = []
        self.findings: list[Finding] = []
        self.outcome = "running"
        self.main_moved = False
        self.retries = 0
        self._refused = 0  # refusals in a row
        self._progress: tuple[Any, ...] = ()
        self._progress_at = time.monotonic()

    # -- the driver ----------------------------------------------------------------------------------------------

    async def drive(self) -> None:
        """Make the operator's calls until the session is terminal, or declare it stuck."""
        while True:
            try:
                status = await self._status()
                if status is not None and status["state"] in TERMINAL:
                    await self._finish(status)
                    return
                if self._stalled(status):
                    await self._give_up(status)
                    return
                if status is None and self.session_id is not None:  # not read (an error, recorded): again
                    await asyncio.sleep(POLL_S)
                    continue
                await self._step(status)
            except ServerGone:
                continue
            except Unreadable as exc:
                self.error("read", str(exc))
                await asyncio.sleep(POLL_S)

    def _stalled(self, status: dict[str, Any] | None) -> bool:
        """No change of state or version (nor a new server process) for stuck_after_s."""
        if status is not None or self.session_id is None:  # a session that could not be read has not moved
            key = (status or {}).get("state"), (status or {}).get("version"), self.run.deployment.generation
            if key != self._progress:
                self._progress, self._progress_at = key, time.monotonic()
        return time.monotonic() - self._progress_at > self.run.stuck_after_s

    async def _status(self) -> dict[str, Any] | None:
        if self.session_id is None:
            self.session_id = await self._find_session()
            if self.session_id is None:
                return None
        reply = await self.caller.call("session_status", session_id=self.session_id)
        if not reply.ok:
            self.error("session_status", reply.text)
            return None
        self.last_state = reply.data["state"]
        return reply.data

    async def _find_session(self) -> str | None:
        """The session of this lifecycle's task, if a start whose answer was lost created one."""
        reply = await self.caller.call("session_list", limit=20)
        if not reply.ok:
            self.error("session_list", reply.text)
            return None
        return next((s["id"] for s in reply.data["sessions"] if s["task_id"] == self.scenario.task), None)

    async def _step(self, status: dict[str, Any] | None) -> None:
        state = status["state"] if status else None
        sc = self.scenario
        if sc.cancel_in and state in WIP_ORDER and WIP_ORDER.index(state) >= WIP_ORDER.index(sc.cancel_in):
            await self._write("session_cancel", session_id=self.session_id, reason="random kills: cancel")
            return
        if state in (None, "created", "initializing", "ready"):
            await self._write("project_session_start", task_id=sc.task)
        elif state == "planning":
            await self._write("session_execute", session_id=self.session_id, agents=[sc.agent])
        elif state == "verifying":
            await self._decide(status)
        elif state == "awaiting_merge":
            if sc.move_main and not self.main_moved:
                await asyncio.to_thread(self._move_main)
            await self._write("project_session_merge", session_id=self.session_id, reason="random kills: merge")
        elif state == "failed":
            await self._failed(status)
        elif state in ("suspended", "abandoned"):
            self.errors.append(f"unexpected state {state}")
            await self._write("session_resume", session_id=self.session_id)
        else:  # executing, merged, rolled_back, timed_out: the server carries it on by itself
            await asyncio.sleep(POLL_S)

    async def _decide(self, status: dict[str, Any]) -> None:
        rows = await history(self.caller, status["id"])
        asked = any(r["trigger"] == "request_changes" and r["outcome"] == "applied" for r in rows)
        arguments: dict[str, Any] = {"decision": "approve", "reason": "random kills: fine"}
        if self.scenario.request_changes and not asked:
            arguments = {"decision": "request_changes", "instructions": "rename the helper"}
        elif self.scenario.ending == "reject":
            arguments = {"decision": "reject", "reason": "random kills: wrong", "compensation": "auto_revert"}
        await self._write("project_decide", session_id=status["id"], expected_version=status["version"], **arguments)

    async def _failed(self, status: dict[str, Any]) -> None:
        rows = [r for r in await history(self.caller, status["id"]) if r["outcome"] == "applied"]
        if rows and rows[-1]["trigger"] == "reject":  # auto_revert's compensation is owed: the server does it
            await asyncio.sleep(POLL_S)
            return
        self.retries += 1
        if self.retries > 5:  # the retry keeps failing: stop asking, let the stall show it
            await asyncio.sleep(POLL_S)
            return
        await self._write("session_fire", session_id=status["id"], trigger="retry", reason="random kills: retry",
                          expected_version=status["version"])  # fmt: skip

    async def _write(self, tool: str, **arguments: Any) -> None:
        """A write call; its answer, when it is a success, is an acknowledged write."""
        reply = await self.caller.call(tool, **arguments)
        if not reply.ok:
            self.error(tool, reply.text)
            self._refused += 1  # the same refusal again and again (a stuck merge) is asked less and less often
            await asyncio.sleep(min(2.0, POLL_S * 2**self._refused))
            return
        self._refused = 0
        data = reply.data
        sid = data.get("session_id") or data.get("id")
        self.session_id = self.session_id or sid
        ack = Ack(sid, tool, data["version"], data["state"], reply.generation)
        if "seq" in data:
            ack.seq, ack.trigger = data["seq"], data["trigger"]
        if tool == "project_decide":
            ack.decision = data["decision"] if data["outcome"] == "applied" else None
        self.run.acks.append(ack)

    def _move_main(self) -> None:
        """Commit on main in the project's checkout, so the merge has to rebase (retried while a git process of
        the killed server still holds the index)."""
        dep = self.run.deployment
        moved = dep.repo / "moves" / f"{self.scenario.task}.md"
        moved.parent.mkdir(exist_ok=True)
        moved.write_text(f"main moved while {self.scenario.task} waited\n")
        identity = ["-c", "user.name=main mover", "-c", "user.email=main@taskgate.invalid"]
        deadline = time.monotonic() + 30
        while True:
            added = subprocess.run(["git", *identity, "add", str(moved)], cwd=dep.repo, capture_output=True, text=True)
            done = subprocess.run(["git", *identity, "commit", "-q", "-m", f"chore: main moves ({self.scenario.task})"],
                                  cwd=dep.repo, capture_output=True, text=True)  # fmt: skip
            if added.returncode == 0 and done.returncode == 0:
                self.main_moved = True
                return
            if time.monotonic() > deadline:
                self.errors.append(f"could not move main: {added.stderr or done.stderr}")
                self.main_moved = True
                return
            time.sleep(0.2)

    def error(self, tool: str, text: str) -> None:
        """A tool error answered: kept for this lifecycle's findings and counted for the run."""
        self.errors.append(f"{tool} in {self.last_state}: {text[:400]}")
        self.run.report.errors[f"{tool}: {blank(text)}"] += 1

    # -- the end -------------------------------------------------------------------------------------------------

    async def _give_up(self, status: dict[str, Any] | None) -> None:
        rows: list[dict[str, Any]] = []
        with suppress(Unreadable):
            rows = await history(self.caller, self.session_id) if self.session_id else []
        agents = [
            (a["run"], a["type"], a["status"], a["exit_code"], a["error"]) for a in (status or {}).get("agents", [])
        ]
        where = f"{status['state']} v{status['version']}" if status else "no session"
        on_main = await asyncio.to_thread(self._work_on_main)
        self.outcome = "stuck"
        what = f"{where} unchanged for {self.run.stuck_after_s:.0f} s; agents {agents}; its work on main: {on_main}"
        self.finding("stuck", what, rows)
        if self.session_id:  # out of the way of the lifecycles after it (WIP, recovery at every restart)
            with suppress(ServerGone):
                await self.caller.call("session_cancel", session_id=self.session_id, reason="random kills: stuck")

    async def _finish(self, status: dict[str, Any]) -> None:
        sc, state = self.scenario, status["state"]
        rows = [r for r in await history(self.caller, status["id"]) if r["outcome"] == "applied"]
        ending = [r["trigger"] for r in rows[-2:]]
        self.outcome = {"merge": "merged", "compensate": "rejected"}.get(ending[0], state)
        planned = {"merge": "merged", "reject": "rejected", "cancel": "cancelled"}[sc.ending]
        if self.outcome != planned or (state == "completed" and ending[1] != "cleanup_done"):
            self.fault(f"ended {state} by {' then '.join(ending)}, not as planned ({planned})", rows)
        await asyncio.to_thread(self._check_git, status, merged=self.outcome == "merged")

    def _check_git(self, status: dict[str, Any], *, merged: bool) -> None:
        """The work on main once per completed agent run after a merge, never otherwise; no worktree or branch
        left (a cancel's clean-up cut off by a kill is pruned at the next start-up: checked at the end)."""
        task = self.scenario.task
        mine = self._work_on_main()
        runs = [a for a in status["agents"] if a["status"] == "completed"]
        by_run = Counter(a["run"] for a in status["agents"])
        if twice := [run for run, n in by_run.items() if n > 1]:
            self.fault(f"agent run(s) {twice} launched more than once: {status['agents']}")
        if merged:
            wanted = [f"{'feat' if n == 1 else 'fix'}: {task} pass {n}" for n in range(1, len(runs) + 1)]
            if sorted(mine) != sorted(wanted):
                self.fault(f"after the merge main has {mine or 'none'} of the work, expected {wanted}")
        elif mine:
            self.fault(f"the work is on main though the session was not merged: {mine}")
        if status["state"] == "completed":
            self.check_left_over(status)

    def _work_on_main(self) -> list[str]:
        """The subjects of this lifecycle's agent commits that are on main."""
        subjects = self.run.deployment.git("log", "--format=%s", "main").splitlines()
        return [s for s in subjects if re.fullmatch(rf"(feat|fix): {self.scenario.task} pass \d+", s)]

    def check_left_over(self, status: dict[str, Any]) -> None:
        """A worktree folder or branch still there for an ended session is a fault."""
        dep, worktree, branch = self.run.deployment, status.get("worktree"), status.get("branch")
        listed = dep.git("worktree", "list", "--porcelain")
        if worktree and (Path(worktree).exists() or f"worktree {worktree}\n" in listed):
            self.fault(f"worktree {worktree} left after {status['state']}")
        if branch and dep.git("branch", "--list", branch).strip():
            self.fault(f"branch {branch} left after {status['state']}")

    async def final_check(self, caller: Caller) -> None:
        """After the last plain restart: the session is where its log says, and nothing of it is left on disk."""
        if self.session_id is None:
            return
        reply = await caller.call("session_status", session_id=self.session_id)
        if not reply.ok:
            self.fault(f"session_status after the last restart: {reply.text}")
            return
        try:
            status, rows = reply.data, await history(caller, self.session_id)
        except Unreadable as exc:
            self.fault(f"cannot read the log after the last restart: {exc}")
            return
        applied = [r for r in rows if r["outcome"] == "applied"]
        last = (applied[-1]["to_state"], applied[-1]["session_version"]) if applied else None
        if last != (status["state"], status["version"]):
            self.fault(f"the session is {status['state']} v{status['version']} but its log ends otherwise", rows)
        if self.outcome != "stuck" and status["state"] not in TERMINAL:
            self.fault(f"{status['state']} after the last restart, though it had ended", rows)
        if status["state"] in TERMINAL:
            await asyncio.to_thread(self.check_left_over, status)

    def fault(self, what: str, rows: list[dict[str, Any]] | None = None) -> None:
        """Something the failure model rules out, other than a lost write or a stuck session."""
        self.finding("fault", what, rows or [])

    def finding(self, kind: str, what: str, rows: list[dict[str, Any]]) -> None:
        """Report a lost write, a stuck session or a fault of this lifecycle (each once)."""
        if any(f.kind == kind and f.what == what for f in self.findings):
            return
        errors = list(dict.fromkeys(reversed(self.errors)))[:6][::-1]  # the last six distinct ones
        found = Finding(kind, self.scenario.task, self.session_id, self.scenario.describe(), what,
                        last_states(rows), errors, list(self.kills))  # fmt: skip
        self.findings.append(found)
        self.run.report.findings.append(found)


# -- reading the log -----------------------------------------------------------------------------------------------


async def history(caller: Caller, session_id: str) -> list[dict[str, Any]]:
    """The session's transition log, applied and blocked rows, oldest first. Raises: ServerGone, Unreadable."""
    reply = await caller.call("session_history", session_id=session_id, limit=10000)
    if not reply.ok:
        raise Unreadable(f"session_history: {reply.text}")
    return reply.data["transitions"]


async def decided(caller: Caller, session_id: str) -> set[str]:
    """The decisions recorded on the session (decision.recorded events). Raises: ServerGone, Unreadable."""
    reply = await caller.call("events_list", session_id=session_id, kind="decision.recorded", limit=10000)
    if not reply.ok:
        raise Unreadable(f"events_list: {reply.text}")
    return {e["payload"]["decision"] for e in reply.data["events"]}


def missing_from(ack: Ack, rows: list[dict[str, Any]], decisions: set[str]) -> str:
    """What of an acknowledged write the log lacks ("" when it is all there)."""
    applied = {r["session_version"]: r for r in rows if r["outcome"] == "applied"}
    row = applied.get(ack.version)
    if row is None or row["to_state"] != ack.state:
        found = f"{row['trigger']} → {row['to_state']}" if row else "no row"
        return f"{ack.describe()}: the log has {found} at v{ack.version}"
    if ack.seq is not None and not any(r["seq"] == ack.seq and r["trigger"] == ack.trigger for r in rows):
        return f"{ack.describe()}: row {ack.seq} ({ack.trigger}) is not in the log"
    if ack.decision and (ack.decision not in decisions or not any(
            r["trigger"] == ack.decision and r["actor"] == "operator:alice" for r in applied.values())):  # fmt: skip
        return f"{ack.describe()}: the decision or its transition is not recorded"
    return ""


def last_states(rows: list[dict[str, Any]], count: int = 6) -> list[str]:
    """The log's last applied rows, one line each, then how many refusals (blocked rows) came after them."""
    applied = [i for i, r in enumerate(rows) if r["outcome"] == "applied"][-count:]
    lines = [f"v{r['session_version']} {r['trigger']}: {r['from_state']} → {r['to_state']} by {r['actor']}"
             f"{': ' + r['reason'][:160] if r['reason'] else ''}" for r in (rows[i] for i in applied)]  # fmt: skip
    blocked = Counter(r["trigger"] for r in rows[(applied[-1] if applied else -1) + 1 :] if r["outcome"] == "blocked")
    return lines + [f"then {n} refused (blocked) {trigger} row(s)" for trigger, n in blocked.items()]


def run_random_kills(
    root: Path, database: str, database_url: str | None, lifecycles: int, seed: int, *, concurrency: int = 1,
    stuck_after_s: float = 60.0, say: Callable[[str], None] = print,
) -> Report:  # fmt: skip
    """Run `lifecycles` lifecycles, `concurrency` at a time, with random kills on one database (SQLite in `root`'s
    data dir when `database_url` is None); the report of what was found."""
    run = Run(root, database, database_url, seed, concurrency=concurrency, stuck_after_s=stuck_after_s, say=say)
    return asyncio.run(run.execute(lifecycles))
