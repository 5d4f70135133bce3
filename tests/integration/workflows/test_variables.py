"""Variables and files in workflow prompts, as a running session meets them: `{session-folder}` and the other
built-ins, single-brace user variables, `{config_source}:key` references into a YAML config, `load:` files read
into the prompt (confined to the project), and the manifest's record of what each step's agents were given.

Runs on the fakes, SQLite and PostgreSQL (`services`), with real git worktrees, real session folders and the real
AgentService; only the agent processes are scripted (tests/workflow_support.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from taskgate.application.agents.outputs import SaveOutput
from taskgate.domain.errors import InvalidInput
from taskgate.domain.states import SessionState
from tests.builders import ACTOR
from tests.workflow_support import planning_with, rig, run_until_idle

SOURCE_DESIGN = """
id: bmad-like
description: a workflow in the source design's style
variables:
  installed_path: "{project-root}/flows/review"
  config_source: "{installed_path}/config.yaml"
  output_folder: "{config_source}:output_folder"
  user_name: "{config_source}:team.lead"
  guide: "{installed_path}/instructions.md"
  template: "{installed_path}/template.md"
steps:
  - id: write
    type: agent
    agent: ok
    load: [guide, template]
    prompt: "For {user_name}: write {output_folder}/report.md in {session-folder} ({{session_id}}); raw {x} stays"
"""


def _project_files(root: Path) -> None:
    flows = root / "flows" / "review"
    flows.mkdir(parents=True)
    (flows / "config.yaml").write_text("output_folder: docs/out\nteam:\n  lead: Ada\n")
    (flows / "instructions.md").write_text("1. Read the diff.\n2. Write the report.\n")
    (flows / "template.md").write_text("# Report\n\n{findings}\n")


async def test_builtins_user_variables_configs_and_loaded_files_reach_the_prompt(services, git_repo, tmp_path):
    _project_files(git_repo)
    r = rig(services, tmp_path, {"dev/bmad-like.yaml": SOURCE_DESIGN}, folders=True)
    session = await planning_with(services, git_repo, r, "bmad-like")
    await r.agents.execute(session.id, ACTOR)
    await run_until_idle(r, session.id)
    assert (await services.sessions.get(session.id)).state == SessionState.VERIFYING
    (prompt,) = r.runner.prompts("ok")
    folder = str(tmp_path / "out" / session.id)
    assert prompt.startswith(f"For Ada: write docs/out/report.md in {folder} ({session.id}); raw {{x}} stays")
    flows = git_repo / "flows" / "review"
    assert f"guide ({flows}/instructions.md):\n1. Read the diff.\n2. Write the report." in prompt
    assert "operator's instructions" not in prompt  # nobody asked for changes
    assert f"template ({flows}/template.md):\n# Report\n\n{{findings}}" in prompt  # file text is not resolved
    manifest = json.loads((tmp_path / "out" / session.id / "manifest.json").read_text())
    (given,) = manifest["inputs"].values()
    assert given["step"] == "write" and given["workflow"] == "bmad-like"
    assert given["prompts"] == [{"agent": "ok", "prompt": prompt}]
    assert given["files"] == {"guide": f"{flows}/instructions.md", "template": f"{flows}/template.md"}


ESCAPE = """
id: escape
description: a load outside the project
variables:
  secret: "{project-root}/../outside.txt"
steps:
  - id: read
    type: agent
    agent: ok
    load: [secret]
    prompt: read it
"""


async def test_a_file_outside_the_project_fails_the_step_and_no_agent_starts(services, git_repo, tmp_path):
    (git_repo.parent / "outside.txt").write_text("do not read me")
    link = git_repo / "inside.txt"
    os.symlink(git_repo.parent / "outside.txt", link)
    r = rig(services, tmp_path, {"dev/escape.yaml": ESCAPE}, folders=True)
    session = await planning_with(services, git_repo, r, "escape")
    await r.agents.execute(session.id, ACTOR)
    await run_until_idle(r, session.id)
    failed = await services.sessions.get(session.id)
    assert failed.state == SessionState.FAILED
    runs = await r.engine.step_runs(session.id)
    assert runs[-1].step_id == "read" and "outside the project" in (runs[-1].error or "")
    assert r.runner.prompts() == []


MISSING_KEY = """
id: missing-key
description: a config reference to a key the file lacks
variables:
  config_source: "{project-root}/flows/review/config.yaml"
steps:
  - id: use
    type: agent
    agent: ok
    prompt: "lead is {config_source}:team.boss"
"""


async def test_a_config_key_that_is_missing_fails_the_step_naming_file_and_keys(services, git_repo, tmp_path):
    _project_files(git_repo)
    r = rig(services, tmp_path, {"dev/missing-key.yaml": MISSING_KEY}, folders=True)
    session = await planning_with(services, git_repo, r, "missing-key")
    await r.agents.execute(session.id, ACTOR)
    await run_until_idle(r, session.id)
    runs = await r.engine.step_runs(session.id)
    assert "has no key 'boss' at team (keys: lead)" in (runs[-1].error or "")
    assert r.runner.prompts() == []


async def test_the_manifest_describes_workflow_execution_agent_related_sessions_and_metadata(
    services, git_repo, tmp_path
):
    from taskgate.application.agents.outputs import ManifestEffect
    from taskgate.application.sessions.commands import FireTrigger
    from taskgate.application.sessions.effects import CompositeEffects

    r = rig(services, tmp_path, {"dev/bmad-like.yaml": SOURCE_DESIGN}, folders=True)
    services.sessions.use_effects(CompositeEffects([services.sessions.effects, ManifestEffect(r.outputs)]))
    _project_files(git_repo)
    session = await planning_with(services, git_repo, r, "bmad-like")
    path = tmp_path / "out" / session.id / "manifest.json"
    pushed = json.loads(path.read_text())
    assert pushed["workflow"] == {"name": "bmad-like", "description": "a workflow in the source design's style"}
    assert pushed["execution"]["status"] == "running" and pushed["execution"]["completed_at"] is None
    assert pushed["execution"]["user"] == session.operator_id
    await r.agents.execute(session.id, ACTOR)
    await run_until_idle(r, session.id)
    done = json.loads(path.read_text())
    assert done["execution"]["status"] == "completed" and done["execution"]["completed_at"] is not None
    assert done["agent"]["name"] == "ok" and done["agent"]["status"] == "completed"
    assert done["metadata"]["state"] == "verifying" and done["metadata"]["branch"] == session.branch_name
    assert done["related_sessions"] == []
    await services.sessions.fire(FireTrigger(session.id, "cancel", ACTOR, reason="changed my mind"))
    cancelled = json.loads(path.read_text())
    assert cancelled["execution"]["status"] == "cancelled"


PLACED = """
id: placed
description: keeps its sessions' folders by workflow and task
session_folder: "{workflow}/{{task.id}}-{session_id}"
steps:
  - id: write
    type: agent
    agent: ok
    prompt: "write into {session-folder}"
"""


async def test_a_workflows_session_folder_template_places_the_folder_under_the_outputs_root(
    services, git_repo, tmp_path
):
    r = rig(services, tmp_path, {"dev/placed.yaml": PLACED}, folders=True)
    session = await planning_with(services, git_repo, r, "placed")
    folder = tmp_path / "out" / "placed" / f"{session.task_id}-{session.id}"
    assert r.outputs.folder(session.id) == str(folder)
    await r.agents.execute(session.id, ACTOR)
    await run_until_idle(r, session.id)
    (prompt,) = r.runner.prompts("ok")
    assert prompt == f"write into {folder}"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["session"] == session.id and manifest["workflow"]["name"] == "placed"
    assert not (tmp_path / "out" / session.id).exists()
    saved = await r.outputs.save_output(SaveOutput(session.id, "notes/a.md", "hello"))
    assert saved.path == "notes/a.md" and (folder / "notes" / "a.md").read_text() == "hello"


async def test_a_session_whose_folder_exists_already_is_not_moved(services, git_repo, tmp_path):
    r = rig(services, tmp_path, {"dev/placed.yaml": PLACED}, folders=True)
    seeded_session = await planning_with(services, git_repo, r, "placed")
    assert r.outputs is not None
    with pytest.raises(InvalidInput, match="is at placed/"):
        await r.outputs.place(seeded_session.id, f"elsewhere/{seeded_session.id}")
    await r.outputs.place(seeded_session.id, f"placed/{seeded_session.task_id}-{seeded_session.id}")  # same: no-op
