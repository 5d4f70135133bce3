"""A git patch (`git diff` output) as files of numbered lines, for the console's diff review: unified rows, side by
side rows, syntax highlighting per file type, and large files marked to be shown collapsed.

Highlighting runs Pygments line by line (a construct spanning lines, e.g. a docstring, is coloured per line: the
price of rendering each diff line on its own). Pygments escapes what it emits; lines it cannot lex stay escaped
plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

LARGE_FILE_LINES = 400  # a file with more changed lines than this is shown collapsed
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$")
_FORMATTER = HtmlFormatter(nowrap=True, classprefix="hl-")


@dataclass(slots=True)
class Line:
    kind: str  # "context" | "add" | "del" | "hunk" | "note"
    old: int | None
    new: int | None
    text: str
    html: Markup = field(default_factory=Markup)


@dataclass(slots=True)
class FileDiff:
    path: str
    old_path: str | None
    status: str  # "modified" | "added" | "deleted" | "renamed" | "binary"
    lines: list[Line] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(1 for line in self.lines if line.kind in ("add", "del"))

    @property
    def large(self) -> bool:
        return self.changed > LARGE_FILE_LINES

    def side_by_side(self) -> list[tuple[Line | None, Line | None]]:
        """Rows of (old side, new side): context on both, a run of deletions paired with the additions after it."""
        rows: list[tuple[Line | None, Line | None]] = []
        dels: list[Line] = []
        adds: list[Line] = []

        def flush() -> None:
            for i in range(max(len(dels), len(adds))):
                rows.append((dels[i] if i < len(dels) else None, adds[i] if i < len(adds) else None))
            dels.clear()
            adds.clear()

        for line in self.lines:
            if line.kind == "del":
                if adds:
                    flush()
                dels.append(line)
            elif line.kind == "add":
                adds.append(line)
            else:
                flush()
                rows.append((line, line))
        flush()
        return rows


def parse_patch(patch: str) -> list[FileDiff]:
    """The files of a `git diff` patch, each line numbered on the old and the new side and highlighted."""
    files: list[FileDiff] = []
    current: FileDiff | None = None
    old = new = 0
    for raw in patch.splitlines():
        if raw.startswith("diff --git "):
            current = FileDiff(_path_of(raw), None, "modified")
            files.append(current)
            continue
        if current is None:
            continue
        if not current.lines and _header(current, raw):
            continue
        hunk = _HUNK.match(raw)
        if hunk:
            old, new = int(hunk[1]), int(hunk[2])
            current.lines.append(Line("hunk", None, None, raw))
        elif raw.startswith("+"):
            current.lines.append(Line("add", None, new, raw[1:]))
            new += 1
        elif raw.startswith("-"):
            current.lines.append(Line("del", old, None, raw[1:]))
            old += 1
        elif raw.startswith(" "):
            current.lines.append(Line("context", old, new, raw[1:]))
            old, new = old + 1, new + 1
        elif raw.startswith("\\"):
            current.lines.append(Line("note", None, None, raw))
    for f in files:
        _highlight(f)
    return files


def _path_of(header: str) -> str:
    """`diff --git a/x b/x` → x (the b side; quoted paths keep git's quoting)."""
    rest = header[len("diff --git ") :]
    marker = rest.rfind(" b/")
    return rest[marker + 3 :] if marker >= 0 else rest


def _header(f: FileDiff, raw: str) -> bool:
    """Reads one extended header line into `f`; False once the hunks begin."""
    if raw.startswith("new file mode"):
        f.status = "added"
    elif raw.startswith("deleted file mode"):
        f.status = "deleted"
    elif raw.startswith("rename from "):
        f.status, f.old_path = "renamed", raw[len("rename from ") :]
    elif raw.startswith("rename to "):
        f.path = raw[len("rename to ") :]
    elif raw.startswith("Binary files"):
        f.status = "binary"
    elif raw.startswith(("index ", "similarity", "old mode", "new mode", "--- ", "+++ ", "dissimilarity", "copy ")):
        pass
    else:
        return False
    return True


@lru_cache(maxsize=256)
def _lexer(path: str) -> Lexer | None:
    try:
        return get_lexer_for_filename(path, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def _highlight(f: FileDiff) -> None:
    lexer = _lexer(f.path.rsplit("/", 1)[-1]) if not f.large else None  # a huge file renders plain: cheaper
    for line in f.lines:
        if lexer is None or line.kind in ("hunk", "note"):
            line.html = escape(line.text)
        else:
            line.html = Markup(highlight(line.text, lexer, _FORMATTER).rstrip("\n"))


def highlight_css() -> str:
    """The stylesheet for the highlighted tokens (served as /static/highlight.css)."""
    return _FORMATTER.get_style_defs(".code")
