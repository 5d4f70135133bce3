"""read_sql.py (the SQLite text the CLI's fast reads run) is what read_statements.py compiles to, today."""

from __future__ import annotations

from taskgate.infrastructure.db import read_statements
from taskgate.infrastructure.db.migrations import SCHEMA_HEAD


def test_read_sql_is_generated_from_the_statements_the_repositories_run() -> None:
    written = read_statements.READ_SQL.read_text()
    assert written == read_statements.module_text(), (
        "read_sql.py is stale: run `python -m taskgate.infrastructure.db.read_statements` and commit it"
    )
    assert f'SCHEMA_HEAD = "{SCHEMA_HEAD}"' in written


def test_every_fast_read_names_its_columns_and_converts_dates_and_json() -> None:
    compiled = read_statements.compile_for_sqlite()
    assert set(compiled) == set(read_statements.FAST_READS)
    kinds = dict(compiled["sessions_of_project"][1])
    assert kinds["created_at"] == "utc" and kinds["state_data"] == "json" and kinds["state"] == ""
    assert dict(compiled["pull_request_of_session"][1])["poke"] == "bool"
    assert "__[POSTCOMPILE_states]" in compiled["sessions_of_project_in"][0]
