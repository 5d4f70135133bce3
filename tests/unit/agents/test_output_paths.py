"""Output paths of the session folder (pure checks) and the manifest's builders."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from taskgate.domain.errors import InvalidInput
from taskgate.domain.outputs import (
    MAX_COMPONENT_BYTES,
    MAX_DEPTH,
    MAX_PATH_BYTES,
    OutputLimits,
    OutputRecord,
    check_quota,
    new_manifest,
    normalise_manifest,
    output_path,
    with_agents,
    with_header,
    with_inputs,
    with_output,
)

SID = "0f0e0d0c-0b0a-4900-8000-000000000001"
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

REFUSED = {
    "": "empty",
    "   ": "empty",
    "..": "'..' component",
    ".": "'.' component",
    "../x": "'..' component",
    "a/../../x": "'..' component",
    "a/./b": "'.' component",
    "/etc/passwd": "absolute",
    "//x": "absolute",
    "a\x00b": "NUL",
    "C:\\x": "backslash",
    "C:x": "drive letter",
    "a\\..\\b": "backslash",
    "a//b": "empty component",
    "a/": "empty component",
    "~/.ssh/x": "starts with '~'",
    ".ssh/authorized_keys": "starts with '.'",
    "a/.git/config": "starts with '.'",
    "-rf": "starts with '-'",
    "a/--output=x": "starts with '-'",
    "a\nb": "U+000A",
    "a\x1b[31m": "U+001B",
    "\u202egnp.exe": "U+202E",
    "a\u200bb": "U+200B",
    "\ufeffa": "U+FEFF",
    "\ud800": "lone surrogate",
    "\uff0e\uff0e/x": "Unicode-folded",
    "a\uff0fb": "Unicode-folded",
    " a": "white space",
    "a ": "white space",
    "manifest.json": "taskgate's own",
    "MANIFEST.JSON": "taskgate's own",
    "x" * (MAX_COMPONENT_BYTES + 1): "longer than",
    "é" * 200: "longer than",
    "/".join(["a"] * (MAX_DEPTH + 1)): "deeper",
    "/".join(["abcdefgh"] * 120): "longer than",
}


@pytest.mark.parametrize("path", list(REFUSED), ids=[repr(p)[:30] for p in REFUSED])
def test_paths_that_could_leave_the_folder_or_mislead_are_refused_naming_the_reason(path):
    with pytest.raises(InvalidInput, match="is refused") as refused:
        output_path(path)
    assert REFUSED[path] in str(refused.value)


@pytest.mark.parametrize(
    "path",
    ["report.md", "reports/tests.txt", "a/b/c/d.json", "résumé.txt", "notes/2026-03-01 review.md", "🔥.txt",
     "sub/manifest.json", "x" * MAX_COMPONENT_BYTES, "a..b", "v1.2/x.."],
)  # fmt: skip
def test_plain_relative_paths_pass_unchanged(path):
    assert output_path(path) == path


def test_paths_come_back_nfc_normalised_and_limits_are_bytes_not_characters():
    assert output_path("e\u0301.txt") == "\u00e9.txt"
    assert len(output_path("/".join(["ab"] * MAX_DEPTH))) < MAX_PATH_BYTES


def test_only_text_is_a_path():
    with pytest.raises(InvalidInput, match="must be text"):
        output_path(b"x")  # type: ignore[arg-type]


def test_a_new_manifest_lists_every_key_of_version_1():
    manifest = new_manifest(SID)
    assert manifest["version"] == 1 and manifest["session"] == SID
    assert set(manifest) == {"version", "session", "task", "agents", "started_at", "completed_at", "status",
                             "outputs", "inputs", "updated_at", "workflow", "execution", "agent", "related_sessions",
                             "metadata"}  # fmt: skip


def test_execution_follows_the_state_and_completed_at_is_set_once_and_cleared_when_it_runs_again():
    from datetime import timedelta

    from taskgate.domain.outputs import with_execution

    later, last = AT + timedelta(minutes=1), AT + timedelta(minutes=2)
    running = with_execution(new_manifest(SID), {"state": "executing", "user": "ada"}, AT)
    assert running["execution"] == {"started_at": AT.isoformat(), "completed_at": None, "status": "running",
                                    "user": "ada"}  # fmt: skip
    verifying = with_execution(running, {"state": "verifying"}, later)
    assert (
        verifying["execution"]["status"] == "completed" and verifying["execution"]["completed_at"] == later.isoformat()
    )
    merged = with_execution(verifying, {"state": "merged"}, last)
    assert merged["execution"]["completed_at"] == later.isoformat() and merged["execution"]["user"] == "ada"
    again = with_execution(verifying, {"state": "executing"}, last)
    assert again["execution"]["status"] == "running" and again["execution"]["completed_at"] is None
    assert with_execution(again, {"state": "abandoned"}, last)["execution"]["status"] == "cancelled"
    assert with_execution(again, {"state": "timed_out"}, last)["execution"]["status"] == "failed"


def test_the_header_is_filled_once():
    first = with_header(new_manifest(SID), {"id": "T-1"}, AT)
    again = with_header(first, {"id": "T-2"}, None)
    assert again["task"] == {"id": "T-1"} and again["started_at"] == AT.isoformat() and again["status"] == "open"


def test_an_output_saved_again_replaces_its_record():
    one = OutputRecord("a.txt", 1, "0" * 64, AT.isoformat(), "agent:t")
    two = OutputRecord("a.txt", 2, "1" * 64, AT.isoformat(), "agent:t")
    manifest = with_output(with_output(new_manifest(SID), one, AT), two, AT)
    assert manifest["outputs"] == [two.to_dict()]


def test_agents_merge_by_id_then_name_and_times_and_status_are_set_when_given():
    manifest = with_agents(new_manifest(SID), [{"id": "a1", "status": "running"}, {"name": "coder"}], AT)
    manifest = with_agents(manifest, [{"id": "a1", "status": "succeeded", "exit_code": 0}, {"name": "tester"}], AT,
                           status="completed", completed_at=AT)  # fmt: skip
    assert manifest["agents"] == [
        {"id": "a1", "status": "succeeded", "exit_code": 0},
        {"name": "coder"},
        {"name": "tester"},
    ]
    assert manifest["status"] == "completed" and manifest["completed_at"] == AT.isoformat()


def test_inputs_merge_key_by_key():
    manifest = with_inputs(with_inputs(new_manifest(SID), {"prompt": "p", "step": 1}, AT), {"step": 2}, AT)
    assert manifest["inputs"] == {"prompt": "p", "step": 2}


def test_quota_counts_an_overwrite_once_and_names_the_limit():
    limits = OutputLimits(max_output_bytes=10, max_outputs=2, max_session_bytes=15)
    manifest = {**new_manifest(SID), "outputs": [{"path": "a", "bytes": 8}, {"path": "b", "bytes": 5}]}
    check_quota(manifest, "a", 10, limits)
    with pytest.raises(InvalidInput, match="per output"):
        check_quota(manifest, "a", 11, limits)
    with pytest.raises(InvalidInput, match="limit is 2"):
        check_quota(manifest, "c", 1, limits)
    with pytest.raises(InvalidInput, match="per session"):
        check_quota(manifest, "b", 8, limits)


def test_a_manifest_read_back_is_checked_and_completed():
    assert normalise_manifest({"version": 1, "session": SID, "outputs": "junk"}, SID)["outputs"] == []
    for bad in ([], {"version": 2, "session": SID}, {"version": 1, "session": "other"}):
        with pytest.raises(InvalidInput):
            normalise_manifest(bad, SID)
