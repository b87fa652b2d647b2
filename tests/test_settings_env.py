"""Configuration: strict parsing, and a malformed value stops start-up naming the variable."""

import re
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from ground.env import env_bool, env_int, env_list, env_rate_limits
from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NRLLM_LEASE_SECONDS", "ninety", "NRLLM_LEASE_SECONDS='ninety' is not an integer"),
        ("NRLLM_MAX_REQUEUES", "-1", "NRLLM_MAX_REQUEUES='-1' must be at least 0"),
        ("NRLLM_MAX_ITERATIONS", "1.5", "NRLLM_MAX_ITERATIONS='1.5' is not an integer"),
        ("NRLLM_RESERVE_MAX_TOKENS", "lots", "NRLLM_RESERVE_MAX_TOKENS='lots' is not an integer"),
        ("NRLLM_RESERVE_MAX_TOKENS", "0", "NRLLM_RESERVE_MAX_TOKENS='0' must be at least 1"),
        # Every reservation would fail in the database (bigint).
        (
            "NRLLM_RESERVE_MAX_TOKENS",
            "10000000000000000000",
            "NRLLM_RESERVE_MAX_TOKENS='10000000000000000000' must be at most 1000000000",
        ),
        (
            "NRLLM_RESERVATION_WAIT_SECONDS",
            "a minute",
            "NRLLM_RESERVATION_WAIT_SECONDS='a minute' is not an integer",
        ),
        ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
        ("DATABASE_URL", "nosuchdb://x", "DATABASE_URL is not a usable database URL"),
        ("NRLLM_TOOLS", "no.such.Tool", "NRLLM_TOOLS: cannot import 'no.such.Tool'"),
        ("LOG_FORMAT", "xml", "LOG_FORMAT='xml' must be plain or json"),
        # Stored with each run's request, where a resume reads it back.
        (
            "NRLLM_RUN_MAX_COST",
            "2.5000000000000",
            "NRLLM_RUN_MAX_COST='2.5000000000000' has more than 10 decimal places",
        ),
        (
            "NRLLM_OPENAI_BASE_URL",
            "http://[::1",
            "NRLLM_OPENAI_BASE_URL='http://[::1' is not a valid URL",
        ),
        (
            "NRLLM_OPENAI_MAX_TOKENS_PARAMETER",
            "max_output_tokens",
            "NRLLM_OPENAI_MAX_TOKENS_PARAMETER='max_output_tokens' must be one of",
        ),
        (
            "NRLLM_PROVIDER_RATE_LIMITS",
            '{"openai:gpt-4o": {"requests_per_minute": 0}}',
            "NRLLM_PROVIDER_RATE_LIMITS: 'openai:gpt-4o' requests_per_minute=0 must be a whole",
        ),
    ],
)
def test_a_malformed_variable_stops_start_up_naming_it(name, value, message):
    env = {"PATH": "/usr/bin:/bin", "SECRET_KEY": "x", name: value}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert message in result.stderr


def test_env_helpers(monkeypatch):
    monkeypatch.setenv("X_BOOL", "Yes")
    monkeypatch.setenv("X_INT", " 42 ")
    monkeypatch.setenv("X_LIST", "a, b,,c ")
    assert env_bool("X_BOOL", False) is True
    assert env_bool("X_UNSET", True) is True
    assert env_int("X_INT", 1) == 42
    assert env_int("X_UNSET", 7) == 7
    assert env_list("X_LIST") == ["a", "b", "c"]
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(ImproperlyConfigured, match="X_INT='0' must be at least 1"):
        env_int("X_INT", 1, minimum=1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "must be a JSON object"),
        ('{"gpt-4o": {"requests_per_minute": 5}}', "'gpt-4o' must be \"kind:model\""),
        ('{"openai:*": {"rpm": 5}}', "must be an object of requests_per_minute and/or"),
        ('{"openai:*": {"tokens_per_minute": 1.5}}', "tokens_per_minute=1.5 must be a whole"),
    ],
)
def test_a_malformed_rate_limit_is_refused_naming_what_is_wrong(monkeypatch, value, message):
    monkeypatch.setenv("NRLLM_PROVIDER_RATE_LIMITS", value)
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        env_rate_limits("NRLLM_PROVIDER_RATE_LIMITS")
    monkeypatch.setenv("NRLLM_PROVIDER_RATE_LIMITS", '{"openai:*": {"requests_per_minute": 5}}')
    assert env_rate_limits("NRLLM_PROVIDER_RATE_LIMITS") == {"openai:*": {"requests_per_minute": 5}}


def test_the_defaults(settings):
    from nrllm_ops import settings as app_settings

    # A short lease, kept in the background while a run waits (G16).
    assert app_settings.NRLLM_LEASE_SECONDS == 30
    assert app_settings.NRLLM_REAPER_INTERVAL_SECONDS == 10
    assert app_settings.NRLLM_WORKER_CONCURRENCY == 100
    assert app_settings.NRLLM_WORKER_DRAIN_SECONDS == 30
    assert app_settings.NRLLM_TOOL_TIME_LIMIT_SECONDS == 300
    assert app_settings.NRLLM_EXECUTE_IN_CALLER is False
    assert app_settings.RQ["WORKER_CLASS"] == "runs.worker.ConcurrentWorker"
    # The embedded default, SQLite: no pool (test_worker_defaults.py has PostgreSQL's).
    assert "pool" not in app_settings.DATABASES["default"]["OPTIONS"]
    assert app_settings.NRLLM_MAX_REQUEUES == 3
    assert app_settings.NRLLM_MAX_ITERATIONS == 20
    assert app_settings.NRLLM_HTTP_ALLOWED_HOSTS == []
    assert app_settings.NRLLM_TOOLS == []


@pytest.mark.django_db
@pytest.mark.parametrize(("value", "prepared"), [(None, True), ("false", False)])
def test_prepared_statements_are_on_unless_switched_off(worker_env, value, prepared):
    # A pooler in transaction mode cannot keep a session's prepared statements.
    env = {k: v for k, v in worker_env.items() if k != "DATABASE_PREPARED_STATEMENTS"}
    if value is not None:
        env["DATABASE_PREPARED_STATEMENTS"] = value
    script = (
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        "    for _ in range(6):\n"
        "        cursor.execute('SELECT count(*) FROM runs_agentrun WHERE status = %s', ['x'])\n"
        "    cursor.execute('SELECT count(*) FROM pg_prepared_statements')\n"
        "    print(cursor.fetchone()[0])"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (int(result.stdout.split()[-1]) > 0) is prepared


def test_a_pool_is_built_for_postgresql_and_refused_where_it_cannot_apply():
    from django.core.exceptions import ImproperlyConfigured

    from ground.database import closed_by_the_server, database_from_url

    pooled = database_from_url(
        "postgres://u@db/n", conn_max_age=0, prepared_statements=True, pool_max_size=20
    )
    assert pooled["OPTIONS"]["pool"] == {
        "min_size": 1,
        "max_size": 20,
        "timeout": 10,
        "check": closed_by_the_server,
    }
    with pytest.raises(ImproperlyConfigured, match="DATABASE_POOL_MAX_SIZE needs a PostgreSQL"):
        database_from_url(
            "sqlite:///x.db", conn_max_age=0, prepared_statements=True, pool_max_size=5
        )
    with pytest.raises(ImproperlyConfigured, match="DATABASE_CONN_MAX_AGE exclude each other"):
        database_from_url(
            "postgres://u@db/n", conn_max_age=60, prepared_statements=True, pool_max_size=5
        )
