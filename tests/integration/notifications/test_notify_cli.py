"""`taskgate notify test` and `notify status` as a user runs them: a subprocess, a config file, a real receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.notifications.conftest import SMTP_PASSWORD, Mailbox, Receiver

TASKGATE = str(Path(sys.executable).with_name("taskgate"))


def _taskgate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TASKGATE_CONFIG": str(tmp_path / "taskgate.toml")}
    return subprocess.run([TASKGATE, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_notify_test_sends_to_each_channel_and_status_shows_them_masked(tmp_path, mailbox: Mailbox, receiver: Receiver):
    broken = f"json://127.0.0.1:1/{SMTP_PASSWORD}"
    (tmp_path / "taskgate.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[notify]\nchannels = {json.dumps([mailbox.url, receiver.url, broken])}\n'
    )
    tested = _taskgate(tmp_path, "notify", "test")
    assert tested.returncode == 4, tested.stderr  # the broken channel
    lines = tested.stdout.splitlines()
    assert [line.endswith(": sent") for line in lines] == [True, True, False] and "failed" in lines[2]
    assert len(mailbox.messages) == 1 and len(receiver.posts) == 1

    status = _taskgate(tmp_path, "notify", "status", "--json")
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    assert [(r["pending"], r["sent"], r["failed"]) for r in rows] == [(0, 0, 0)] * 3
    for output in (tested.stdout + tested.stderr, status.stdout + status.stderr):
        assert SMTP_PASSWORD not in output


def test_notify_without_channels_says_what_to_configure(tmp_path):
    (tmp_path / "taskgate.toml").write_text(f'data_dir = "{tmp_path / "data"}"\n')
    done = _taskgate(tmp_path, "notify", "status")
    assert done.returncode == 1 and "[notify] channels" in done.stderr


def test_doctor_lists_the_channels_masked_without_sending(tmp_path, receiver: Receiver):
    secret = f"json://hook:{SMTP_PASSWORD}@127.0.0.1:1/KEY-0123"
    (tmp_path / "taskgate.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[notify]\nchannels = {json.dumps([receiver.url, secret])}\n'
    )
    done = _taskgate(tmp_path, "doctor", "--json")
    [notify] = [c for c in json.loads(done.stdout) if c["name"] == "notify"]
    assert notify["status"] == "ok" and "2 channel(s)" in notify["detail"]
    assert SMTP_PASSWORD not in done.stdout and "KEY-0123" not in done.stdout
    assert receiver.posts == []
