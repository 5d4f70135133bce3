"""The policy book: built-in defaults, global [policies.*] tables, per-project overrides, checked at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskgate.application.sessions.policy_book import PolicyBook, ProjectPolicies
from taskgate.application.workspaces.options import GitOptions
from taskgate.bootstrap import policy_book
from taskgate.domain.errors import InvalidInput
from taskgate.domain.policies.violations import Severity
from taskgate.infrastructure.settings import load_settings


def names(book: PolicyBook, project: str | None = None) -> list[str]:
    return [p.name for p in book.active(project)]


def write_config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "taskgate.toml").write_text(text)
    return tmp_path


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("TASKGATE_")]:
        monkeypatch.delenv(key)


def test_the_default_book_enables_every_built_in_but_commit_message_format_and_tracker_in_sync_in_priority_order():
    book = PolicyBook()
    assert names(book) == [
        "one_active_session_per_task",
        "wip_limit",
        "operator_capacity",
        "plan_open",
        "task_unblocked",
        "branch_naming",
        "clean_worktree",
        "review_approval",
        "require_tests",
    ]
    disabled = [e.policy.name for e in book.entries() if not e.enabled]
    assert disabled == ["commit_message_format", "tracker_in_sync"]


def test_a_project_overrides_the_global_tables_key_by_key():
    book = PolicyBook(
        {"review_approval": {"min_approvals": 2}, "clean_worktree": {"severity": "warning"}},
        {
            "shop": ProjectPolicies(
                ("pytest",), 60, {"review_approval": {"enabled": False}, "commit_message_format": {"enabled": True}}
            )
        },
    )
    assert book.per_project
    glob = {p.name: p for p in book.active(None)}
    assert glob["review_approval"].min_approvals == 2 and glob["clean_worktree"].severity == Severity.WARNING
    shop = {p.name: p for p in book.active("shop")}
    assert "review_approval" not in shop and "commit_message_format" in shop
    assert shop["clean_worktree"].severity == Severity.WARNING  # inherited from the global table
    assert book.tests("shop").test_command == ("pytest",) and book.tests("other").test_command == ()
    assert names(book, "unknown project") == names(book)


def test_branch_naming_defaults_to_the_shape_of_the_configured_branch_pattern():
    pattern = GitOptions(branch_pattern="work/{task_id}/{short_id}").branch_regex().pattern
    [branch_naming] = [p for p in PolicyBook(branch_pattern=pattern).active() if p.name == "branch_naming"]
    assert branch_naming.settings["pattern"] == pattern


def test_unknown_policies_and_settings_fail_at_start_naming_the_key():
    with pytest.raises(InvalidInput, match=r"projects\.shop\.policies\.speling: unknown policy"):
        PolicyBook({}, {"shop": ProjectPolicies(policies={"speling": {}})})
    with pytest.raises(InvalidInput, match=r"projects\.shop\.policies\.review_approval\.min_approvals: must be at"):
        PolicyBook({}, {"shop": ProjectPolicies(policies={"review_approval": {"min_approvals": 0}})})
    with pytest.raises(InvalidInput, match="always on"):
        PolicyBook({"one_active_session_per_task": {"enabled": False}})


def test_the_config_file_feeds_the_book_and_keeps_the_wip_limit_table_working(tmp_path, monkeypatch):
    write_config(
        tmp_path,
        """
[policies.wip_limit]
limit = 5
[policies.review_approval]
min_approvals = 2
[projects.shop]
test_command = ["pytest", "-q"]
test_timeout_s = 90
[projects.shop.policies.clean_worktree]
severity = "warning"
""",
    )
    monkeypatch.setenv("TASKGATE_POLICIES__WIP_LIMIT__LIMIT", "7")
    settings = load_settings(tmp_path)
    assert settings.policies.wip_limit.limit == 7
    book = policy_book(settings)
    shop = {p.name: p for p in book.active("shop")}
    assert shop["wip_limit"].limit == 7 and shop["review_approval"].min_approvals == 2
    assert shop["clean_worktree"].severity == Severity.WARNING
    assert book.tests("shop").test_command == ("pytest", "-q") and book.tests("shop").test_timeout_s == 90


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[policies.speling]\nenabled = true\n", "policies.speling"),
        ("[policies.review_approval]\nmin_aprovals = 2\n", "policies.review_approval.min_aprovals"),
        ("[projects.shop]\ntest_comand = ['x']\n", "projects.shop.test_comand"),
        ("[projects.shop.policies.require_tests]\nreuse = 'maybe'\n", "projects.shop.policies.require_tests.reuse"),
    ],
)
def test_a_config_file_with_an_unknown_key_is_refused_naming_it(tmp_path, text, named):
    write_config(tmp_path, text)
    with pytest.raises(InvalidInput, match=named.replace(".", r"\.")):
        load_settings(tmp_path)


def test_a_bad_regex_in_the_config_fails_when_the_book_is_built(tmp_path):
    write_config(tmp_path, "[policies.commit_message_format]\nenabled = true\npattern = '('\n")
    with pytest.raises(InvalidInput, match=r"policies\.commit_message_format\.pattern: invalid regular expression"):
        policy_book(load_settings(tmp_path))
