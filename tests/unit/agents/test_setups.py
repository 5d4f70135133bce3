"""What taskgate writes for a CLI before it starts (Codex's private CODEX_HOME and provider, aider's ignored cache
folder) and the check that the model endpoint an agent would use is complete."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import replace

import pytest

from taskgate.application.agents.setups import check_endpoint, prepare
from taskgate.domain.agents.presets import PRESETS
from taskgate.domain.agents.setups import IGNORE_ALL, codex_config, endpoint_problem
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.agent_runner import SubprocessAgentRunner


class Runner:
    """The part of the AgentRunner port the set-up uses: the service's environment, files read and written."""

    def __init__(self, environ: dict[str, str], files: dict[str, str] | None = None) -> None:
        self.environ, self.files, self.written = environ, files or {}, {}

    def environment(self, names: Sequence[str]) -> dict[str, str]:
        return {name: self.environ[name] for name in names if self.environ.get(name)}

    def read_private(self, path: str) -> str | None:
        return self.files.get(path)

    def write_private(self, path: str, text: str) -> None:
        self.written[path] = text

    def ignore_in_worktree(self, worktree: str, folder: str) -> None:
        self.written[f"{worktree}/{folder}/.gitignore"] = IGNORE_ALL


def start(runner: Runner, preset: str) -> dict[str, str]:
    return prepare(runner, PRESETS[preset].agent_type(), folder="/s", agent_id="a1", worktree="/w")


def test_codex_gets_a_private_home_whose_provider_is_built_from_the_users_variables():
    runner = Runner({"OPENAI_API_KEY": "sk-secret", "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1/"})
    assert start(runner, "codex") == {"CODEX_HOME": "/s/a1.codex"}
    config = tomllib.loads(runner.written["/s/a1.codex/config.toml"])
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:8000/v1" and provider["env_key"] == "OPENAI_API_KEY"
    assert provider["wire_api"] == "responses"
    assert "sk-secret" not in runner.written["/s/a1.codex/config.toml"]  # the key stays in the environment
    assert list(runner.written) == ["/s/a1.codex/config.toml"]


def test_codex_with_a_key_and_no_base_url_talks_to_openai_through_the_same_provider():
    runner = Runner({"OPENAI_API_KEY": "sk-secret"})
    start(runner, "codex")
    config = tomllib.loads(runner.written["/s/a1.codex/config.toml"])
    assert config["model_providers"]["taskgate"]["base_url"] == "https://api.openai.com/v1"


def test_an_agent_types_own_env_gives_the_endpoint_over_the_service_environment():
    kind = replace(PRESETS["codex"].agent_type(), env={"OPENAI_BASE_URL": "http://models.internal:9000/v1"})
    runner = Runner({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://elsewhere/v1"})
    prepare(runner, kind, folder="/s", agent_id="a1", worktree="/w")
    assert 'base_url = "http://models.internal:9000/v1"' in runner.written["/s/a1.codex/config.toml"]


def test_codex_without_a_key_gets_a_copy_of_its_own_login_and_no_provider():
    runner = Runner({"CODEX_HOME": "/home/u/.codex-work"}, {"/home/u/.codex-work/auth.json": '{"tokens": 1}'})
    start(runner, "codex")
    assert runner.written["/s/a1.codex/auth.json"] == '{"tokens": 1}'
    assert "model_provider" not in tomllib.loads(runner.written["/s/a1.codex/config.toml"])
    runner = Runner({}, {"~/.codex/auth.json": "{}"})
    start(runner, "codex")
    assert "/s/a1.codex/auth.json" in runner.written


def test_a_base_url_that_is_not_a_url_is_refused():
    with pytest.raises(InvalidInput, match="OPENAI_BASE_URL is not an http"):
        start(Runner({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": 'localhost:8000"\nmodel = "x'}), "codex")
    with pytest.raises(ValueError):
        codex_config("ftp://models")


def test_aiders_cache_folder_is_made_ignored_by_git_from_inside_and_nothing_else_is_set_up():
    runner = Runner({"OPENAI_API_KEY": "k"})
    assert start(runner, "aider") == {}
    assert runner.written == {"/w/.aider.tags.cache.v4/.gitignore": "*\n"}
    assert start(runner := Runner({}), "claude") == {} and runner.written == {}


@pytest.mark.parametrize(
    ("preset", "environ", "problem"),
    [
        ("codex", {"OPENAI_BASE_URL": "http://m/v1"}, "OPENAI_BASE_URL is set but OPENAI_API_KEY is not"),
        ("claude", {"ANTHROPIC_BASE_URL": "http://m", "CLAUDE_CODE_USE_BEDROCK": "1"}, "ANTHROPIC_BASE_URL is set"),
        ("aider", {"OPENAI_API_BASE": "http://m/v1", "ANTHROPIC_API_KEY": "k"}, "OPENAI_API_BASE is set but"),
        ("aider", {"OPENAI_BASE_URL": "m:8000", "OPENAI_API_KEY": "k"}, "OPENAI_BASE_URL is not an http(s) URL"),
        ("codex", {"OPENAI_BASE_URL": "http://m/v1", "OPENAI_API_KEY": "k"}, None),
        ("claude", {"ANTHROPIC_AUTH_TOKEN": "t"}, None),
        ("coder", {"OPENAI_BASE_URL": "nonsense"}, None),  # no model: no endpoint
    ],
)
def test_an_endpoint_variable_needs_a_key_for_it_and_a_url(preset, environ, problem):
    kind = PRESETS[preset].agent_type()
    found = endpoint_problem(kind.endpoint, kind.endpoint_keys, environ)
    assert (found is None) if problem is None else (problem in str(found))


def test_a_launch_with_an_incomplete_endpoint_is_refused_naming_the_agent_type():
    with pytest.raises(InvalidInput) as refused:
        check_endpoint(Runner({"OPENAI_BASE_URL": "http://m/v1"}), PRESETS["codex"].agent_type())
    assert "agent type 'codex': OPENAI_BASE_URL is set but OPENAI_API_KEY is not" in str(refused.value)
    check_endpoint(Runner({"OPENAI_BASE_URL": "http://m/v1", "OPENAI_API_KEY": "k"}), PRESETS["codex"].agent_type())


def test_the_real_runner_marks_a_folder_ignored_without_following_a_link_or_recreating_a_removed_worktree(tmp_path):
    runner = SubprocessAgentRunner()
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    runner.ignore_in_worktree(str(worktree), ".cache.v4")
    assert (worktree / ".cache.v4" / ".gitignore").read_text() == IGNORE_ALL
    runner.ignore_in_worktree(str(worktree), ".cache.v4")  # again: the same
    outside = tmp_path / "outside"
    outside.mkdir()
    (worktree / ".planted").symlink_to(outside)  # a link an earlier run committed
    runner.ignore_in_worktree(str(worktree), ".planted")
    assert list(outside.iterdir()) == []
    runner.ignore_in_worktree(str(tmp_path / "removed"), ".cache.v4")
    assert not (tmp_path / "removed").exists()
