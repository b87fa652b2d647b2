# The two commands the README promises: `make run` and `make test`.
PYTHON ?= $(shell scripts/find-python)
VENV := .venv
PY := $(VENV)/bin/python
# The bench's peer (DBOS Transact) lives in a virtualenv of its own.
DBOS_VENV := .venv-dbos
export NRLLM_BENCH_DBOS_PYTHON := $(CURDIR)/$(DBOS_VENV)/bin/python
PYTEST_ARGS ?=
# Where `make run` serves: `make run RUN_ADDRESS=127.0.0.1:8001`.
RUN_ADDRESS ?= 127.0.0.1:8000
# Where `make run` keeps the admin's generated password (not NRLLM_ADMIN_PASSWORD's).
ADMIN_PASSWORD_FILE ?= var/admin-password

.PHONY: run test lint venv dev-venv bench bytecode screenshots clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

$(DBOS_VENV)/.installed: bench/requirements-dbos.txt
	test -x $(DBOS_VENV)/bin/python || $(PYTHON) -m venv $(DBOS_VENV)
	$(DBOS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r bench/requirements-dbos.txt
	touch $@

venv: $(VENV)/.installed
dev-venv: $(VENV)/.dev-installed

## make run: the app with demo data on SQLite, no Redis: the web server and,
## beside it, the embedded worker (delayed retries when due, the reaper).
## Ctrl-C (or SIGTERM) stops both, a stop asked for being a success; the
## worker finishes the run in hand first.
## The set-up is quiet (a line per demo run) and ends with how to log in:
## the admin's address, the user and the password (or where it is).
run: venv
	mkdir -p var
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py seed_demo
	$(PY) manage.py ensure_admin --url http://$(RUN_ADDRESS)/admin/ --password-file $(ADMIN_PASSWORD_FILE)
# migrate ran the system checks; runserver stands in for gunicorn on
# purpose (docs/operations.md), so its warning that it is no production
# server is not printed under the block.
	@trap 'stopped=1; kill $$server $$worker 2>/dev/null' INT TERM; \
	$(PY) manage.py embedded_worker & worker=$$!; \
	DJANGO_RUNSERVER_HIDE_WARNING=true \
	$(PY) manage.py runserver --insecure --noreload --skip-checks $(RUN_ADDRESS) & server=$$!; \
	wait $$server; status=$$?; kill $$worker 2>/dev/null; wait; \
	if [ -n "$$stopped" ]; then exit 0; fi; exit $$status

## make lint: ruff, the migrations check and the OpenAPI schema check.
lint: dev-venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DATABASE_URL=sqlite:///:memory: SECRET_KEY=migrations-check \
		$(PY) manage.py makemigrations --check --dry-run
	DATABASE_URL=sqlite:///:memory: SECRET_KEY=schema-check \
		$(PY) manage.py spectacular --validate --fail-on-warn > /dev/null

## make test: installs what is missing, starts a throwaway PostgreSQL and
## redis-server, runs the whole suite against them, stops them.
test: dev-venv $(DBOS_VENV)/.installed
	scripts/install-system-deps
	$(MAKE) lint
	$(MAKE) bytecode
	$(PY) -m tests.harness $(PY) -m pytest $(PYTEST_ARGS)

## make bytecode: the project's modules compiled once. Where
## PYTHONDONTWRITEBYTECODE is set (this workplace's machines set it), no
## process writes them, and every one the tests start (hundreds of workers)
## compiled them again: a quarter of a worker's start (0.25 of 1.3 s of CPU).
bytecode: venv
	$(PY) -m compileall -q -j0 -x '/\.venv' .

## make bench: the runtime's cost against baselines measured in the same run
## (durable PostgreSQL), written to bench/results.json and bench/results.md.
bench: dev-venv $(DBOS_VENV)/.installed
	scripts/install-system-deps
	$(MAKE) bytecode
	NRLLM_HARNESS_DURABLE=1 $(PY) -m tests.harness $(PY) -m bench.run

## make screenshots: refresh docs/screenshots/ from the browser test.
screenshots: dev-venv
	scripts/install-system-deps
	NRLLM_UPDATE_SCREENSHOTS=1 $(PY) -m tests.harness $(PY) -m pytest -n0 tests/test_browser.py tests/test_browser_approvals.py tests/test_browser_mcp_tools.py tests/test_browser_overview.py tests/test_browser_laptop.py tests/test_browser_agents.py

clean:
	rm -rf $(VENV) $(DBOS_VENV) var .pytest_cache .ruff_cache
