"""`[notify]` and `[projects.<name>.notify]`: channels checked at load time, shown masked, routed per project."""

from __future__ import annotations

import pytest

from taskgate.bootstrap import notify_channels
from taskgate.domain.errors import InvalidInput
from taskgate.infrastructure.settings import load_settings
from tests.unit.test_settings import clean_env, write_config  # noqa: F401 (clean_env: an autouse fixture)

MAIL = "mailto://ops:pw-S3cr3t@localhost:2525?smtp=127.0.0.1&to=op@example.com"


def test_channels_load_as_secrets_and_projects_add_their_own_or_replace_the_top_level_ones(tmp_path):
    write_config(
        tmp_path,
        f'''
[notify]
channels = ["{MAIL}", "json://127.0.0.1:9/hook"]
on = ["decision", "question"]
batch_s = 5
ci_failures = 3

[projects.shop.notify]
channels = ["ntfy://shop-alerts"]
on = ["agent"]

[projects.vault.notify]
inherit = false
''',
    )
    settings = load_settings(tmp_path)
    assert "pw-S3cr3t" not in repr(settings) and "pw-S3cr3t" not in settings.model_dump_json()
    assert settings.notify.batch_s == 5 and settings.notify.ci_failures == 3 and not settings.notify.include_details
    mail, hook, shop = notify_channels(settings)
    assert mail.url == MAIL and "pw-S3cr3t" not in mail.shown and "****" in mail.shown
    assert mail.wants("decision", "shop") and not mail.wants("agent", "shop") and not mail.wants("decision", "vault")
    assert shop.project == "shop" and shop.wants("agent", "shop") and not shop.wants("decision", "shop")
    assert shop.shown == "ntfys://s...s"  # a public ntfy topic is its own password
    assert hook.shown == "json://127.0.0.1:9/…"  # a webhook's path is often its key: never shown


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[notify]\nchannels = ["json://x", "nosuchservice://pw-S3cr3t@host"]\n', "notify.channels[1]"),
        ('[notify]\non = ["decision", "lunch"]\n', "notify.on"),
        ('[projects.shop.notify]\nchannels = ["bogus://pw-S3cr3t"]\n', "projects.shop.notify.channels"),
        ('[notify]\nconsole_url = "console.example"\n', "notify.console_url"),
    ],
)
def test_bad_notify_config_is_an_error_at_load_naming_the_key_without_the_secret(tmp_path, text, key):
    write_config(tmp_path, text)
    with pytest.raises(InvalidInput) as raised:
        load_settings(tmp_path)
    assert key in str(raised.value) and "pw-S3cr3t" not in str(raised.value)


def test_without_channels_there_is_no_channel_and_every_kind_is_on_by_default(tmp_path):
    write_config(tmp_path, "[notify]\nbatch_s = 1\n")
    settings = load_settings(tmp_path)
    assert notify_channels(settings) == []
    assert settings.notify.on == ["decision", "question", "agent", "ci", "budget"]


def test_a_send_error_is_scrubbed_of_the_urls_user_password_path_and_query_values():
    from taskgate.infrastructure.apprise_notify import scrub

    url = "json://hookuser:pw-S3cr3t@hooks.example:8080/t/KEY-abcdef?token=tok-98765&x=1"
    said = "POST to hookuser:pw-S3cr3t@hooks.example:8080/t/KEY-abcdef?token=tok-98765 failed: 500"
    clean = scrub(said, url)
    for secret in ("hookuser", "pw-S3cr3t", "KEY-abcdef", "tok-98765"):
        assert secret not in clean
    assert "hooks.example:8080" in clean and "500" in clean


def test_a_configuration_that_started_before_loads_without_apprise(tmp_path, monkeypatch):
    """Channels are checked once per configuration: once a full start of it remembered it (settings_cache.py),
    loading it again does not import Apprise (~0.2 s of every command); any edit of the file checks them again."""
    import subprocess
    import sys

    from taskgate.infrastructure import settings_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_config(tmp_path, '[notify]\nchannels = ["json://127.0.0.1:9/hook"]\n')
    probe = "import sys; from taskgate.infrastructure.settings import load_settings; load_settings(); "
    probe += "print('apprise' in sys.modules)"

    def loads_apprise() -> bool:
        done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip() == "True"

    assert loads_apprise()  # never started: checked
    settings_cache.remember({"database_url": "sqlite:///x"}, tmp_path)
    assert not loads_apprise()
    write_config(tmp_path, '[notify]\nchannels = ["bogus://pw-S3cr3t"]\n')  # edited: a new configuration
    with pytest.raises(InvalidInput, match=r"notify\.channels"):
        load_settings(tmp_path)
