"""Settings: TOML file, TASKGATE_* environment (nested with __), and which file was used."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.settings import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (
        "TASKGATE_CONFIG",
        "TASKGATE_DATABASE_URL",
        "TASKGATE_DATA_DIR",
        "TASKGATE_POLICIES__WIP_LIMIT__LIMIT",
    ):
        monkeypatch.delenv(name, raising=False)


def write_config(root: Path, text: str) -> Path:
    (root / "config").mkdir(parents=True, exist_ok=True)
    path = root / "config" / "taskgate.toml"
    path.write_text(text)
    return path


def test_without_a_config_file_the_defaults_put_sqlite_under_data(tmp_path):
    settings = load_settings(tmp_path)
    assert settings.config_file is None
    assert settings.data_dir == (tmp_path / "data").resolve()
    assert settings.resolved_database_url == f"sqlite:///{tmp_path.resolve() / 'data' / 'taskgate.db'}"
    assert settings.policies.wip_limit.limit == 3


def test_the_config_file_is_found_and_named_and_its_paths_are_relative_to_the_project(tmp_path):
    path = write_config(tmp_path, 'data_dir = "state"\n[policies.wip_limit]\nlimit = 5\n[operator]\ndefault = "ops"\n')
    settings = load_settings(tmp_path)
    assert settings.config_file == path.resolve()
    assert settings.data_dir == (tmp_path / "state").resolve()
    assert settings.policies.wip_limit.limit == 5 and settings.operator.default == "ops"


def test_environment_wins_over_the_file_with_nested_names(tmp_path, monkeypatch):
    write_config(tmp_path, "[policies.wip_limit]\nlimit = 5\n")
    monkeypatch.setenv("TASKGATE_POLICIES__WIP_LIMIT__LIMIT", "7")
    monkeypatch.setenv("TASKGATE_DATABASE_URL", "postgresql+asyncpg://u@h/db")
    settings = load_settings(tmp_path)
    assert settings.policies.wip_limit.limit == 7
    assert settings.resolved_database_url == "postgresql+asyncpg://u@h/db"


def test_an_explicit_config_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKGATE_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(InvalidInput, match=r"missing\.toml does not exist"):
        load_settings(tmp_path)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[policies.wip_limit]\nlimit = 0\n", "policies.wip_limit.limit"),
        ("bogus = 1\n", "bogus"),
        ('[sqlite]\nsynchronous = "SOMETIMES"\n', "sqlite.synchronous"),
    ],
)
def test_invalid_values_name_the_field_and_the_file(tmp_path, text, field):
    write_config(tmp_path, text)
    with pytest.raises(InvalidInput) as raised:
        load_settings(tmp_path)
    assert field in str(raised.value) and "taskgate.toml" in str(raised.value)


@pytest.mark.parametrize(
    "entry",
    [
        'sha256 = "abc"\noperator = "alice"',
        f'sha256 = "{"a" * 64}"',
        f'sha256 = "{"a" * 64}"\noperator = "a"\nsession = "s"',
    ],
)
def test_a_configured_token_needs_a_sha256_and_exactly_one_owner(tmp_path, entry):
    write_config(tmp_path, f"[[mcp.tokens]]\n{entry}\n")
    with pytest.raises(InvalidInput, match=r"mcp\.tokens"):
        load_settings(tmp_path)


def test_configured_tokens_are_read_from_the_file(tmp_path):
    write_config(tmp_path, f'[[mcp.tokens]]\noperator = "alice"\nsha256 = "{"b" * 64}"\n')
    [token] = load_settings(tmp_path).mcp.tokens
    assert token.operator == "alice" and token.session is None


def test_escalation_webhooks_must_name_configured_webhooks(tmp_path):
    hook = '[[webhooks]]\nname = "ci"\nurl = "http://127.0.0.1:9/hooks"\nsecret = "s"\n'
    write_config(tmp_path, f'{hook}\n[escalation]\nwebhooks = ["ops", "ci"]\n')
    with pytest.raises(InvalidInput) as raised:
        load_settings(tmp_path)
    message = str(raised.value)
    assert "escalation.webhooks names no [[webhooks]] entry: ops (configured: ci)" in message
    assert "taskgate.toml" in message

    write_config(tmp_path, f'{hook}\n[escalation]\nwebhooks = ["ci"]\n')
    assert load_settings(tmp_path).escalation.webhooks == ["ci"]


@pytest.mark.parametrize(
    "agent",
    ['credentials = ["GITHUB_TOKEN"]', 'env = { GITHUB_TOKEN = "x" }', 'credentials = ["TG_HOOK_SECRET"]'],
)
def test_an_agent_type_may_not_pass_the_forges_token_or_webhook_secret_on(tmp_path, agent):
    forge = '[forge]\nkind = "github"\nrepository = "acme/shop"\nwebhook_secret_env = "TG_HOOK_SECRET"\n'
    write_config(tmp_path, f'{forge}\n[agents.coder]\ncommand = ["true"]\n{agent}\n')
    with pytest.raises(InvalidInput, match=r"agents\.coder passes (GITHUB_TOKEN|TG_HOOK_SECRET) on to its agents"):
        load_settings(tmp_path)
    write_config(tmp_path, f'[agents.coder]\ncommand = ["true"]\n{agent}\n')  # no forge: it is the user's to pass
    assert load_settings(tmp_path).agents["coder"].command == ["true"]


def test_a_forge_is_configured_per_project_or_for_all(tmp_path):
    write_config(tmp_path, '[forge]\nkind = "github"\nmerge_method = "squash"\n\n[projects.web.forge]\nkind = "none"\n')
    settings = load_settings(tmp_path)
    assert (settings.forge.kind, settings.forge.merge_method, settings.forge.token_env) == ("github", "squash",
                                                                                          "GITHUB_TOKEN")  # fmt: skip
    assert settings.projects["web"].forge.kind == "none"
    write_config(tmp_path, '[forge]\nkind = "gitlab"\n')
    with pytest.raises(InvalidInput, match=r"forge\.kind"):
        load_settings(tmp_path)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[budgets]\nday = {usd = -1}\n", "budgets.day.usd: must be a positive number, not -1"),
        ("[budgets]\nsession = {tokens = 0}\n", "budgets.session.tokens: must be a positive whole number, not 0"),
        ("[budgets]\nmonthly = {usd = 5}\n", "budgets.monthly: unknown key"),
        ("[projects.shop]\nbudgets = {task = {euros = 3}}\n", "projects.shop.budgets.task.euros: unknown key"),
    ],
)
def test_a_bad_budget_names_its_key_and_the_file(tmp_path, text, field):
    write_config(tmp_path, text)
    with pytest.raises(InvalidInput) as raised:
        load_settings(tmp_path)
    assert field in str(raised.value) and "taskgate.toml" in str(raised.value)


def test_budgets_are_read_with_a_projects_own_table_over_them(tmp_path):
    write_config(tmp_path, "[budgets]\nday = {usd = 5.0}\nexpected = {usd = 1.0}\n\n"
                           "[projects.shop.budgets]\nday = {usd = 50}\n")  # fmt: skip
    budgets = load_settings(tmp_path).budget_book()
    assert budgets.of("shop").caps.day.usd == 50.0 and budgets.of("other").caps.day.usd == 5.0
    assert budgets.of("shop").expected.usd == 1.0
