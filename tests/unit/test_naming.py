"""Safe git names (domain/naming.py) against hostile task ids, titles, session ids and branch patterns.

Every name `branch_name` builds from untrusted text must pass our own `check_ref_name` *and* the real
`git check-ref-format --branch` (run as a subprocess with an argv list, in a fresh empty repository so that
`@{-1}` and friends expand to nothing), and must be free of option, path and revision tricks.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgate.domain.errors import InvalidInput
from taskgate.domain.naming import (
    DEFAULT_BRANCH_PATTERN,
    MAX_COMPONENT,
    MAX_REF,
    branch_name,
    check_branch_pattern,
    check_ref_name,
    check_session_id,
    ref_component,
    slug,
)

SESSION_ID = "0123abcd-4567-89ab-cdef-0123456789ab"

# Hostile task ids / titles. Each one is fed, as given, to branch_name (as task_id and as title) and to
# check_ref_name (raw).
CORPUS: list[str] = [
    # options
    "--upload-pack=touch /tmp/x",
    "--upload-pack=touch${IFS}/tmp/pwned",
    "-x",
    "-",
    "--",
    "---",
    "--force",
    "-c core.sshCommand=touch /tmp/x",
    # paths and revision syntax
    "../x",
    "../../etc/passwd",
    "/etc/passwd",
    "a..b",
    "..",
    ".",
    "x@{1}",
    "@",
    "@{-1}",
    "HEAD@{yesterday}",
    "main^0",
    "main~1",
    "refs/heads/main",
    "refs/heads/../../config",
    ".git/hooks/pre-commit",
    "foo.lock",
    "foo.lock/bar",
    "x.LOCK",
    "a.lock.lock",
    ".hidden",
    "a/.hidden/b",
    "trailing/",
    "trailing.",
    "a//b",
    "/leading",
    # whitespace and control characters
    "name with spaces",
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "nul\x00byte",
    "bell\x07escape\x1b[31mred",
    "del\x7f",
    "\x01\x02\x03",
    "   ",
    # characters git forbids
    "~^:?*[\\",
    "a~1",
    "what?",
    "glob*",
    "bracket[0]",
    "back\\slash",
    "colon:x",
    # shell metacharacters
    "; rm -rf ~",
    "$(id)",
    "`id`",
    "a|b&c>d<e",
    "'quoted' \"double\"",
    "${HOME}",
    # unicode lookalikes, invisible and direction-changing characters
    "ｍａｉｎ",  # fullwidth
    "fix／etc／passwd",  # fullwidth solidus
    "a\u2024\u2024b",  # one-dot leaders look like '..'
    "\u2010\u2010upload-pack",  # unicode hyphens look like '--'
    "\u2212x",  # minus sign
    "mаin",  # Cyrillic a
    "evil\u202egnp.exe",  # right-to-left override
    "zero\u200bwidth",
    "\ufeffbom",
    "nb\u00a0sp",
    "next\u0085line",
    "e\u0301\u0301\u0301",  # combining accents
    "İstanbul K",  # lower() changes length / maps to ASCII
    "😀🔥",
    # sizes and degenerate values
    "",
    "x" * 10_000,
    "-" * 10_000,
    "." * 500,
    "a." * 5_000,
    "--.--.--",
    "-.-.-.lock",
    "HEAD",
    "T-1",  # a normal id, to show it survives
]

CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f-\x9f\s]")
SAFE_CHARS = re.compile(r"^[A-Za-z0-9._/-]+$")
BRANCH_PATTERNS = [
    DEFAULT_BRANCH_PATTERN,
    "taskgate/{session_id}",
    "{slug}-{short_id}",
    "tg/{task_id}/{slug}/{short_id}",
    "{task_id}.{slug}.{short_id}",
]


# -- helpers --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def git_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh, empty repository: `--branch` runs there, so `@{-1}` has nothing to expand to."""
    repo = tmp_path_factory.mktemp("refcheck")
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=git_env(repo))
    return repo


def git_env(home: Path) -> dict[str, str]:
    """The environment without user/system git configuration."""
    return {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def git_accepts(repo: Path, name: str) -> bool:
    """Whether `git check-ref-format --branch <name>` accepts `name` (argv list: no shell involved).

    A NUL byte cannot even be passed in argv, so git can never be given such a name: counted as refused.
    """
    if "\x00" in name:
        return False
    done = subprocess.run(
        ["git", "check-ref-format", "--branch", name], cwd=repo, env=git_env(repo), capture_output=True, check=False
    )
    return done.returncode == 0


def git_verdicts(repo: Path, names: Iterable[str]) -> dict[str, bool]:
    """`git_accepts` for many names, a few subprocesses at a time."""
    unique = sorted(set(names))
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(unique, pool.map(lambda name: git_accepts(repo, name), unique), strict=True))


def assert_safe_branch(name: str) -> None:
    """Everything a generated branch name must be, beyond git's own rules."""
    assert check_ref_name(name) == name
    assert 0 < len(name) <= MAX_REF
    assert SAFE_CHARS.match(name), name
    assert ".." not in name
    assert "@{" not in name
    assert not CONTROL_OR_SPACE.search(name)
    assert not name.startswith("-")
    assert not name.startswith("/") and not name.endswith("/") and "//" not in name
    assert not name.endswith(".")
    for part in name.split("/"):
        assert part, name
        assert not part.startswith("."), name
        assert not part.startswith("-"), name
        assert not part.lower().endswith(".lock"), name


def refused(check: Callable[[str], str], value: str) -> bool:
    """Whether `check(value)` raises InvalidInput (any other exception fails the test)."""
    try:
        check(value)
    except InvalidInput:
        return True
    return False


def short(text: str) -> str:
    """A printable prefix of a corpus entry for test ids and messages."""
    return repr(text[:40]) + ("…" if len(text) > 40 else "")


# -- branch_name on the corpus ----------------------------------------------------------------------------------


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 40
    assert len(set(CORPUS)) == len(CORPUS)


@pytest.mark.parametrize("hostile", CORPUS, ids=[short(c) for c in CORPUS])
def test_branch_name_of_hostile_input_is_safe(hostile: str) -> None:
    name = branch_name(DEFAULT_BRANCH_PATTERN, task_id=hostile, session_id=SESSION_ID, title=hostile)
    assert_safe_branch(name)
    assert name.startswith("feature/") and name.endswith("/0123abcd")
    assert name.count("/") == 2  # the task id cannot add or remove components


@pytest.mark.parametrize("pattern", BRANCH_PATTERNS)
def test_every_pattern_keeps_hostile_input_safe(pattern: str) -> None:
    for hostile in CORPUS:
        assert_safe_branch(branch_name(pattern, task_id=hostile, session_id=SESSION_ID, title=hostile))


def test_git_accepts_every_branch_name_built_from_the_corpus(git_repo: Path) -> None:
    names = {
        branch_name(pattern, task_id=hostile, session_id=SESSION_ID, title=hostile)
        for pattern in BRANCH_PATTERNS
        for hostile in CORPUS
    }
    verdicts = git_verdicts(git_repo, names)
    assert not [name for name, ok in verdicts.items() if not ok]


def test_check_ref_name_refuses_raw_hostile_input_that_git_refuses(git_repo: Path) -> None:
    verdicts = git_verdicts(git_repo, CORPUS)
    must_refuse = [raw for raw in CORPUS if not verdicts[raw] or raw.startswith("-")]
    assert len(must_refuse) >= 40  # the corpus is mostly names git itself refuses
    assert [short(raw) for raw in must_refuse if not refused(check_ref_name, raw) and raw != "HEAD"] == []


def test_check_ref_name_refuses_head(git_repo: Path) -> None:
    assert not git_accepts(git_repo, "HEAD")
    assert refused(check_ref_name, "HEAD")


@pytest.mark.parametrize(
    "raw",
    ["-x", "--upload-pack=x", "a..b", "x@{1}", "@", "a b", "a\tb", "a\nb", "a\x00b", "a\x7f", "a~b", "a^b", "a:b",
     "a?b", "a*b", "a[b", "a\\b", "x.lock", "a/.b", ".a", "a/", "/a", "a//b", "a.", "", "x" * (MAX_REF + 1)],
)  # fmt: skip
def test_check_ref_name_refuses(raw: str) -> None:
    with pytest.raises(InvalidInput, match="not a safe branch name"):
        check_ref_name(raw)


@pytest.mark.parametrize(
    "good", ["main", "feature/T-1/0123abcd", "refs/heads/main", "a.b/c_d-e", "x" * MAX_REF, "v1.2.3", "a-lock"]
)
def test_check_ref_name_accepts_ordinary_names(good: str, git_repo: Path) -> None:
    assert check_ref_name(good) == good
    assert git_accepts(git_repo, good)


def test_error_message_is_truncated_for_huge_input() -> None:
    with pytest.raises(InvalidInput) as caught:
        check_ref_name("-" + "x" * 10_000)
    assert len(str(caught.value)) < 300


# -- ref_component and slug -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--upload-pack=evil", "upload-pack-evil"),
        ("../x", "x"),
        ("../../etc/passwd", "etc-passwd"),
        ("a..b", "a.b"),
        ("T-1", "T-1"),
        ("foo.lock", "foo"),
        ("a.lock.lock", "a"),
        ("x.LOCK", "x"),
        ("; rm -rf ~", "rm-rf"),
        ("$(id)", "id"),
        ("", "x"),
        ("---", "x"),
        ("...", "x"),
        (".lock", "lock"),
        ("ｍａｉｎ", "x"),
    ],
)
def test_ref_component(text: str, expected: str) -> None:
    assert ref_component(text) == expected


def test_ref_component_length_and_fallback() -> None:
    assert len(ref_component("x" * 10_000)) == MAX_COMPONENT
    assert ref_component("-" * 10_000, fallback="task") == "task"
    # truncation must not leave a trailing '-' / '.' or an '.lock' end
    assert not ref_component("a" * (MAX_COMPONENT - 1) + ".lock").endswith((".", "-", ".lock"))
    assert not ref_component("a" * (MAX_COMPONENT - 5) + ".lock" + "b" * 10).endswith((".", "-", ".lock"))


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("Fix the login bug!", "fix-the-login-bug"),
        ("one two three four five six seven", "one-two-three-four-five-six"),
        ("; rm -rf ~", "rm-rf"),
        ("$(id) `whoami`", "id-whoami"),
        ("", "task"),
        ("!!!", "task"),
        ("ｍａｉｎ", "task"),
    ],
)
def test_slug(title: str, expected: str) -> None:
    assert slug(title) == expected


# -- check_branch_pattern ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", [*BRANCH_PATTERNS, "agent/{task_id}-{session_id}"])
def test_valid_patterns_are_accepted(pattern: str) -> None:
    assert check_branch_pattern(pattern) == pattern


@pytest.mark.parametrize(
    "pattern",
    [
        "feature/{user}/{short_id}",
        "feature/{task}/{short_id}",
        "{}/{short_id}",
        "{0}/{short_id}",
        "{task_id.__class__}/{short_id}",
        "{task_id[0]}/{short_id}",
        "{short_id.__init__.__globals__}",
        "{SHORT_ID}",
    ],
)
def test_unknown_placeholders_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidInput, match="unknown placeholder"):
        check_branch_pattern(pattern)


@pytest.mark.parametrize("pattern", ["feature/{task_id}", "feature/{slug}", "static-branch", "{task_id}-{slug}", ""])
def test_patterns_without_a_unique_id_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidInput, match="short_id"):
        check_branch_pattern(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        "-{short_id}",
        "--upload-pack={short_id}",
        "feature/../{short_id}",
        "feature/{short_id}.lock",
        "feature//{short_id}",
        "feature/{short_id}/",
        "/feature/{short_id}",
        "feature/{short_id}.",
        ".hidden/{short_id}",
        "x y/{short_id}",
        "x\t{short_id}",
        "x\n{short_id}",
        "feature~{short_id}",
        "feature:{short_id}",
        "feature^{short_id}",
        "feature?{short_id}",
        "feature*{short_id}",
        "feature[{short_id}",
        "feature\\{short_id}",
        "{short_id}@{{1}}",
        "feature/" + "x" * MAX_REF + "/{short_id}",
    ],
)
def test_patterns_producing_invalid_refs_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidInput, match="not a safe branch name"):
        check_branch_pattern(pattern)


@pytest.mark.parametrize("pattern", ["feature/{short_id", "feature/{short_id}}", "{short_id:{task_id}}"])
def test_malformed_patterns_are_refused_as_invalid_input(pattern: str) -> None:
    with pytest.raises(InvalidInput):
        check_branch_pattern(pattern)


@pytest.mark.parametrize("pattern", ["x/a{short_id:.0}", "x{task_id:.<4}/{short_id}", "x/{task_id!r}/{short_id}"])
def test_format_specs_and_conversions_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidInput):
        check_branch_pattern(pattern)


# -- check_session_id -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "",
        "x",
        "-x",
        "0123abcd",
        SESSION_ID.upper(),
        SESSION_ID.replace("-", ""),
        "{" + SESSION_ID + "}",
        "urn:uuid:" + SESSION_ID,
        SESSION_ID + "x",
        "x" + SESSION_ID,
        " " + SESSION_ID,
        SESSION_ID + " ",
        SESSION_ID + "/../x",
        "../" + SESSION_ID,
        SESSION_ID[:-1] + "g",
        SESSION_ID.replace("-", "/"),
        "0123abcd-4567-89ab-cdef-0123456789a\x00",
        "０１２３abcd-4567-89ab-cdef-0123456789ab",  # fullwidth digits
        "--upload-pack=x",
    ],
)
def test_check_session_id_refuses_non_uuids(bad: str) -> None:
    with pytest.raises(InvalidInput, match="not a UUID"):
        check_session_id(bad)


def test_check_session_id_refuses_a_trailing_newline() -> None:
    with pytest.raises(InvalidInput):
        check_session_id(SESSION_ID + "\n")


def test_check_session_id_accepts_lower_case_uuids() -> None:
    for _ in range(20):
        value = str(uuid.uuid4())
        assert check_session_id(value) == value


def test_branch_name_refuses_a_bad_session_id() -> None:
    for bad in ("../x", "-x", SESSION_ID.upper(), ""):
        with pytest.raises(InvalidInput, match="not a UUID"):
            branch_name(DEFAULT_BRANCH_PATTERN, task_id="T-1", session_id=bad)


# -- property: any text at all ----------------------------------------------------------------------------------

FRAGMENTS = ["-", "--", ".", "..", "/", "//", "@", "@{", "{", "}", ".lock", "~", "^", ":", "\\", "\x00", "\n", " "]
HOSTILE_TEXT = st.one_of(
    st.text(),  # every code point but surrogates, control characters included
    st.text(st.characters(max_codepoint=0x7F)),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=30).map("".join),
    st.sampled_from(CORPUS),
)


def test_branch_name_of_any_text_is_safe_and_accepted_by_git(git_repo: Path) -> None:
    """Hypothesis checks our rules per example; git then checks every distinct name, in parallel, once."""
    built: list[str] = []

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(
        pattern=st.sampled_from(BRANCH_PATTERNS),
        task_id=HOSTILE_TEXT,
        title=HOSTILE_TEXT,
        session=st.uuids().map(str),
    )
    def property_holds(pattern: str, task_id: str, title: str, session: str) -> None:
        name = branch_name(pattern, task_id=task_id, session_id=session, title=title)
        assert_safe_branch(name)
        built.append(name)

    property_holds()
    verdicts = git_verdicts(git_repo, built)
    assert len(verdicts) >= 50
    assert not [name for name, ok in verdicts.items() if not ok]
