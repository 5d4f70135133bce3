"""Safe git names for sessions: branch names and worktree folder names built from untrusted text.

Task ids, titles and configured patterns come from users and trackers. Nothing from them reaches git
as given: every piece is normalised to the characters `[A-Za-z0-9._-]`, stripped of leading `-` and `.`
(so it can never be read as an option such as `--upload-pack=…` or as a hidden/relative path), and the
assembled name is checked against the rules of `git check-ref-format` before it is used. The adapter
additionally passes `--` before every ref and path argument.
"""

from __future__ import annotations

import re
import string

from taskgate.domain.errors import InvalidInput

DEFAULT_BRANCH_PATTERN = "feature/{task_id}/{short_id}"
PLACEHOLDERS = frozenset({"task_id", "short_id", "session_id", "slug"})
MAX_COMPONENT = 60
MAX_REF = 200

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DASHES = re.compile(r"-{2,}")
_DOTS = re.compile(r"\.{2,}")
_SESSION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Characters git forbids anywhere in a ref (check-ref-format rules 3-5), plus whitespace and backslash.
_FORBIDDEN_IN_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def ref_component(text: str, fallback: str = "x") -> str:
    """`text` as one safe ref path component: `[A-Za-z0-9._-]`, no leading `-`/`.`, no `..`, no `.lock` end.

    >>> ref_component("--upload-pack=evil")
    'upload-pack-evil'
    >>> ref_component("../x")
    'x'
    """
    cleaned = _UNSAFE.sub("-", text)
    cleaned = _DOTS.sub(".", cleaned)
    cleaned = _DASHES.sub("-", cleaned)
    cleaned = cleaned.strip("-.")[:MAX_COMPONENT].strip("-.")
    while cleaned.lower().endswith(".lock"):
        cleaned = cleaned[: -len(".lock")].rstrip("-.")
    return cleaned or fallback


def slug(title: str, max_words: int = 6) -> str:
    """A short lower-case slug of a title, e.g. 'Fix the login bug!' → 'fix-the-login-bug'."""
    words = re.findall(r"[a-z0-9]+", title.lower())[:max_words]
    return ref_component("-".join(words), fallback="task")


def check_branch_pattern(pattern: str) -> str:
    """Validate a configured branch pattern. Raises: InvalidInput naming the bad placeholder or text."""
    try:
        parsed = list(string.Formatter().parse(pattern))
    except ValueError as exc:
        raise InvalidInput(f"branch pattern {pattern!r} is malformed: {exc}") from None
    if any(spec or conversion for _, name, spec, conversion in parsed if name is not None):
        raise InvalidInput(f"branch pattern {pattern!r} may use plain placeholders only, without ':' or '!'")
    fields = {name for _, name, _, _ in parsed if name is not None}
    unknown = fields - PLACEHOLDERS
    if unknown:
        raise InvalidInput(
            f"branch pattern {pattern!r} uses unknown placeholder(s) {sorted(unknown)}; "
            f"allowed: {', '.join(sorted(PLACEHOLDERS))}"
        )
    if "short_id" not in fields and "session_id" not in fields:
        raise InvalidInput(f"branch pattern {pattern!r} must contain {{short_id}} or {{session_id}} to be unique")
    sample = pattern.format(task_id="T-1", short_id="0123abcd", session_id="0" * 36, slug="title")
    check_ref_name(sample)
    return pattern


def branch_name(pattern: str, *, task_id: str, session_id: str, title: str = "") -> str:
    """The session's branch from `pattern`, every placeholder normalised. Raises: InvalidInput."""
    session_id = check_session_id(session_id)
    name = pattern.format(
        task_id=ref_component(task_id, fallback="task"),
        short_id=session_id[:8],
        session_id=session_id,
        slug=slug(title),
    )
    return check_ref_name(name)


def check_ref_name(name: str) -> str:
    """`name` if it is a branch name git accepts and no git option or path trick. Raises: InvalidInput."""
    problem = _ref_problem(name)
    if problem:
        raise InvalidInput(f"{name[:80]!r} is not a safe branch name: {problem}")
    return name


def _ref_problem(name: str) -> str | None:
    if not name or len(name) > MAX_REF:
        return f"length must be 1-{MAX_REF}"
    if name.startswith("-"):
        return "it starts with '-' (would be read as an option)"
    if _FORBIDDEN_IN_REF.search(name):
        return "it contains a space, control character or one of ~ ^ : ? * [ \\"
    if name == "HEAD":
        return "'HEAD' is not a branch name"
    if ".." in name or "@{" in name or name == "@":
        return "it contains '..' or '@{'"
    if name.startswith("/") or name.endswith("/") or "//" in name or name.endswith("."):
        return "it has an empty component or ends with '.'"
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"component {part!r} starts with '.' or ends with '.lock'"
    return None


def check_session_id(session_id: str) -> str:
    """`session_id` if it is a lower-case UUID (safe as a folder name). Raises: InvalidInput."""
    if not _SESSION_ID.fullmatch(session_id):
        raise InvalidInput(f"session id {session_id[:40]!r} is not a UUID")
    return session_id
