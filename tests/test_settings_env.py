"""Configuration: strict parsing, and a malformed value stops start-up naming the variable."""

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from nrllm_ops.env import env_bool, env_int, env_list
from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NRLLM_LEASE_SECONDS", "ninety", "NRLLM_LEASE_SECONDS='ninety' is not an integer"),
        ("NRLLM_MAX_REQUEUES", "-1", "NRLLM_MAX_REQUEUES='-1' must be at least 0"),
        ("NRLLM_MAX_ITERATIONS", "1.5", "NRLLM_MAX_ITERATIONS='1.5' is not an integer"),
        ("DEBUG", "maybe", "DEBUG='maybe' is not a boolean"),
        ("DATABASE_URL", "nosuchdb://x", "DATABASE_URL is not a usable database URL"),
        ("NRLLM_TOOLS", "no.such.Tool", "NRLLM_TOOLS: cannot import 'no.such.Tool'"),
        ("LOG_FORMAT", "xml", "LOG_FORMAT='xml' must be plain or json"),
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


def test_the_defaults(settings):
    from nrllm_ops import settings as app_settings

    assert app_settings.NRLLM_LEASE_SECONDS == 900
    assert app_settings.NRLLM_MAX_REQUEUES == 3
    assert app_settings.NRLLM_MAX_ITERATIONS == 20
    assert app_settings.NRLLM_HTTP_ALLOWED_HOSTS == []
    assert app_settings.NRLLM_TOOLS == []
