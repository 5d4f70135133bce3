"""The console's pure parts: the patch parser behind the diff review, the sign-ins and their CSRF tokens, the
one-poller change feed behind live pages, and how user text is made visible."""

from __future__ import annotations

import asyncio
import time

import pytest

from taskgate.domain.access import Principal
from taskgate.domain.errors import Unauthenticated
from taskgate.entrypoints.console.diff_view import LARGE_FILE_LINES, parse_patch
from taskgate.entrypoints.console.live import ChangeFeed, stream
from taskgate.entrypoints.console.signins import SignIns, check_csrf
from taskgate.entrypoints.console.web import _local, visible

PATCH = """diff --git a/src/calc.py b/src/calc.py
index 1111111..2222222 100644
--- a/src/calc.py
+++ b/src/calc.py
@@ -1,4 +1,4 @@
 def total(xs):
-    return sum(xs)
+    return sum(xs or [])
\x20
 # end
@@ -10,2 +10,3 @@ def other():
 x = 1
+y = "<b>"
 z = 3
diff --git a/notes.md b/docs/notes.md
similarity index 90%
rename from notes.md
rename to docs/notes.md
diff --git a/logo.png b/logo.png
new file mode 100644
Binary files /dev/null and b/logo.png differ
"""


def test_a_patch_becomes_files_of_numbered_lines() -> None:
    calc, notes, logo = parse_patch(PATCH)
    assert (calc.path, calc.status, notes.path, notes.old_path, notes.status) == (
        "src/calc.py", "modified", "docs/notes.md", "notes.md", "renamed")  # fmt: skip
    assert logo.status == "binary" and logo.lines == []
    rows = [(line.kind, line.old, line.new, line.text) for line in calc.lines if line.kind != "hunk"]
    assert rows[:3] == [("context", 1, 1, "def total(xs):"), ("del", 2, None, "    return sum(xs)"),
                        ("add", None, 2, "    return sum(xs or [])")]  # fmt: skip
    assert rows[5:] == [("context", 10, 10, "x = 1"), ("add", None, 11, 'y = "<b>"'), ("context", 11, 12, "z = 3")]
    assert calc.changed == 3


def test_highlighted_lines_escape_what_they_show() -> None:
    added = next(line for line in parse_patch(PATCH)[0].lines if line.text == 'y = "<b>"')
    assert "<b>" not in added.html and "&lt;b&gt;" in added.html and "hl-" in added.html


def test_side_by_side_pairs_a_deletion_with_the_addition_after_it() -> None:
    rows = parse_patch(PATCH)[0].side_by_side()
    paired = [(old.text, new.text) for old, new in rows if old is not None and new is not None and old.kind == "del"]
    assert paired == [("    return sum(xs)", "    return sum(xs or [])")]
    alone = [new.text for old, new in rows if old is None]
    assert alone == ['y = "<b>"']


def test_a_file_with_many_changed_lines_is_large_and_rendered_plain() -> None:
    lines = "".join(f"+line {i}\n" for i in range(LARGE_FILE_LINES + 1))
    big = parse_patch(f"diff --git a/big.py b/big.py\n--- a/big.py\n+++ b/big.py\n@@ -0,0 +1,401 @@\n{lines}")[0]
    assert big.large and "hl-" not in big.lines[1].html


def test_sign_ins_refuse_agents_and_expire() -> None:
    sign_ins = SignIns(lifetime_s=0.05)
    with pytest.raises(Unauthenticated, match="agent tokens cannot sign in"):
        sign_ins.open("tg_agent", Principal.agent("tok1", "session-1"))
    cookie, sign_in = sign_ins.open("tg_x", Principal.operator("alice"))
    assert sign_ins.find(cookie) is sign_in and sign_ins.find("guess") is None and sign_ins.find(None) is None
    assert check_csrf(sign_in, sign_in.csrf) and not check_csrf(sign_in, "") and not check_csrf(sign_in, None)
    assert not check_csrf(sign_in, sign_in.csrf[:-1])
    time.sleep(0.06)
    assert sign_ins.find(cookie) is None


def test_two_sign_ins_have_different_cookies_and_csrf_tokens() -> None:
    sign_ins = SignIns()
    (a, first), (b, second) = (sign_ins.open("tg", Principal.operator("alice")) for _ in range(2))
    assert a != b and first.csrf != second.csrf
    sign_ins.close(a)
    assert sign_ins.find(a) is None and sign_ins.find(b) is second


def test_user_text_shows_control_characters_as_symbols() -> None:
    assert visible("\x1b[31mred\x1b[0m\tok\n") == "␛[31mred␛[0m\tok\n"
    assert visible(None) == ""


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example", "javascript:alert(1)", "board"])
def test_redirects_stay_on_the_console(target: str) -> None:
    assert _local(target, "/") == "/"


async def test_one_poller_serves_many_listeners_and_wakes_them_on_a_move() -> None:
    reads = 0
    mark = 5

    async def read() -> int:
        nonlocal reads
        reads += 1
        return mark

    feed = ChangeFeed(read, interval_s=0.01)
    assert await feed.current() == 5
    waiting = [asyncio.create_task(feed.wait_past(5, timeout=5)) for _ in range(50)]
    await asyncio.sleep(0.05)
    assert feed.listeners == 50
    before = reads
    await asyncio.sleep(0.05)
    assert reads - before <= 10  # one poll per tick, not one per listener
    mark = 6
    assert await asyncio.gather(*waiting) == [6] * 50
    await feed.close()


async def test_the_event_stream_says_changed_and_ends_with_the_sign_in() -> None:
    marks = iter([1, 2, 2, 2, 2, 2, 2, 2])

    async def read() -> int:
        return next(marks, 2)

    feed = ChangeFeed(read, interval_s=0.01)
    alive = iter([True, True, False])

    async def still_signed_in() -> bool:
        return next(alive)

    sent = [chunk async for chunk in stream(feed, 1, still_signed_in, heartbeat_s=0.05)]
    assert sent == ["retry: 2000\n\n", "event: changed\ndata: 2\n\n", ": still here\n\n"]
    await feed.close()


async def test_stopping_the_feed_ends_every_open_stream_at_once() -> None:
    async def read() -> int:
        return 1

    feed = ChangeFeed(read, interval_s=0.01)

    async def signed_in() -> bool:
        return True

    async def drain() -> list[str]:
        return [chunk async for chunk in stream(feed, 1, signed_in, heartbeat_s=60)]

    streams = [asyncio.create_task(drain()) for _ in range(5)]
    await asyncio.sleep(0.05)
    await feed.stop()
    assert await asyncio.wait_for(asyncio.gather(*streams), timeout=2) == [["retry: 2000\n\n"]] * 5
