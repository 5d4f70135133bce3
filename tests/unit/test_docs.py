"""Docs that match the code: the state diagram in docs/architecture.md is the generated one."""

from pathlib import Path

from taskgate.domain.session_fsm import to_mermaid

ROOT = Path(__file__).resolve().parents[2]


def test_the_architecture_doc_shows_the_diagram_generated_from_the_transition_table():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```mermaid\n{to_mermaid()}\n```" in doc


def test_the_readme_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["make demo", "make test"]


def test_the_failure_model_names_every_crash_point():
    from taskgate.application.sessions.crashpoints import POINTS

    doc = (ROOT / "docs" / "failure-model.md").read_text()
    rows = [line.split("|")[1].strip().replace("`", "") for line in doc.splitlines() if line.startswith("| `")]
    assert sorted({row.split()[0] for row in rows}) == sorted(POINTS)
    assert "merge.git_done after a rebase" in rows  # tests/e2e/test_crash_points.py has that case too


def test_the_operators_doc_shows_the_loop_generated_from_the_transition_table():
    from taskgate.domain.session_fsm import loop_to_mermaid

    doc = (ROOT / "docs" / "operators.md").read_text()
    assert f"```mermaid\n{loop_to_mermaid()}\n```" in doc
