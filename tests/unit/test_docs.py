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


def test_what_an_agent_cannot_do_names_every_attempt_of_the_hostile_agent():
    """docs/agents.md's table of what an agent cannot do stays true: it names every attempt the hostile agent makes
    (tests/e2e/test_sandbox_hostile.py checks each is refused), and no attempt it does not make."""
    import re

    hostile = (ROOT / "tests" / "support" / "hostile_agent.py").read_text()
    attempts = set(re.findall(r'attempt\("([a-z-]+)"', hostile))
    doc = (ROOT / "docs" / "agents.md").read_text()
    section = doc.split("### What an agent can and cannot do: the sandbox", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    documented = {name for cell in first_cells for name in re.findall(r"`([a-z-]+)`", cell)}
    assert len(attempts) == 18 and documented == attempts, (attempts - documented, documented - attempts)
