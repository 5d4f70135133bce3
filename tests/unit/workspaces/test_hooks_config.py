"""The `[hooks]` table: checked when the config loads (an unknown key, a non-string, a bad timeout named), and the
hooks a project gets (`[projects.<name>.hooks]` over `[hooks]`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskgate.application.workspaces.hooks import HookBook, HookRun, Hooks
from taskgate.application.workspaces.ports import HookResult
from taskgate.bootstrap import hook_book
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.settings import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("TASKGATE_CONFIG", raising=False)


def load(root: Path, text: str):
    (root / ".taskgate").mkdir(parents=True, exist_ok=True)
    (root / ".taskgate" / "taskgate.toml").write_text(text)
    return load_settings(root)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('before_agnet = "make"', r"hooks\.before_agnet: Extra inputs are not permitted"),
        ("after_create = 3", r"hooks\.after_create: Input should be a valid string"),
        ('after_create = ["make", "setup"]', r"hooks\.after_create: Input should be a valid string"),
        ("timeout_s = 0", r"hooks\.timeout_s: Input should be greater than 0"),
        ("timeout_s = -5", r"hooks\.timeout_s: Input should be greater than 0"),
    ],
)
def test_a_bad_hooks_table_is_refused_at_load_naming_the_key(tmp_path, table, named):
    with pytest.raises(InvalidInput, match=named) as refused:
        load(tmp_path, f"[hooks]\n{table}\n")
    assert "taskgate.toml" in str(refused.value)


def test_a_bad_project_hooks_table_names_the_project(tmp_path):
    with pytest.raises(InvalidInput, match=r"projects\.web\.hooks\.after_agnet: Extra inputs"):
        load(tmp_path, '[projects.web.hooks]\nafter_agnet = "x"\n')


def test_a_project_hooks_table_replaces_the_top_level_one_for_that_project_only(tmp_path):
    settings = load(tmp_path, '[hooks]\nafter_create = "make setup"\ntimeout_s = 60\n'
                              '[projects.web.hooks]\nbefore_agent = "npm ci"\n')  # fmt: skip
    book = hook_book(settings)
    assert book.of("api") == Hooks(after_create="make setup", timeout_s=60)
    assert book.of("web").configured() == {"before_agent": "npm ci"} and book.of("web").timeout_s == 300
    assert load(tmp_path / "none", "").hooks.after_create == ""


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"after_create": 1}, "hooks.after_create must be a shell command"),
        ({"timeout_s": 0}, "hooks.timeout_s must be seconds above 0"),
        ({"timeout_s": True}, "hooks.timeout_s must be seconds above 0"),
        ({"before_remove": "a\0b"}, "hooks.before_remove holds a NUL"),
    ],
)
def test_the_application_checks_hooks_again(kwargs, named):
    with pytest.raises(InvalidInput, match=named):
        Hooks(**kwargs)


def test_no_hooks_configured_means_none_run():
    assert HookBook().of("any").configured() == {}
    assert Hooks(after_create="  ", before_agent="npm ci").configured() == {"before_agent": "npm ci"}


def test_a_failure_message_names_the_hook_its_command_how_it_ended_its_last_line_and_the_log():
    run = HookRun("after_create", "make setup", HookResult(2, 1.27, "No rule to make target"), "/d/hooks.log", 300)
    assert run.message() == (
        "hook after_create (`make setup`) exited 2 after 1.3 s: No rule to make target; see /d/hooks.log"
    )
    killed = HookRun("before_agent", "sleep 9", HookResult(None, 3.1, "", timed_out=True), "/d/hooks.log", 2.5)
    assert killed.message() == "hook before_agent (`sleep 9`) was killed at its timeout of 2.5 s; see /d/hooks.log"
    missing = HookRun("after_agent", "x", HookResult(None, 0, "", error="No such file or directory: /w"), "/l", 1)
    assert missing.message() == "hook after_agent (`x`) could not be started (No such file or directory: /w); see /l"
