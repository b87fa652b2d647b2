"""Commits that must reach disk when the database's default says they need
not: ``ALTER DATABASE … SET synchronous_commit = off``, a common tuning. The
records that must reach disk (a write's fence and record, the settle, an
operator's change of an approval policy) set ``synchronous_commit = on`` for
their own transaction, whatever the default.

The crashable server and its helpers are ``test_commit_durability``'s.
"""

import contextlib
import os
import signal

import psycopg
import pytest

from tests.drifting_model import MODELS, NOTIFY, request_for
from tests.helpers import wait_until
from tests.test_commit_durability import (  # noqa: F401  (server_url: the crashable server)
    _app_env,
    _manage,
    _output_of,
    _restarted_without,
    _run,
    _run_with_the_wal_writer_stalled,
    _stall_wal_writer,
    server_url,
)

pytestmark = pytest.mark.worker


@contextlib.contextmanager
def _database_default_off(url: str):
    """``ALTER DATABASE … SET synchronous_commit = off``, a common tuning,
    for the sessions opened meanwhile."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER DATABASE postgres SET synchronous_commit = off")
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER DATABASE postgres RESET synchronous_commit")


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_with_the_database_default_off_a_writes_fence_record_and_settle_still_reach_disk(
    model,
    server_url,  # noqa: F811
    workers,
    worker_env,
):
    """The records that must reach disk set ``synchronous_commit = on`` for
    their own transaction, whatever the database's default says: a crash
    after the run completed loses nothing of it — the fence's commit carried
    the claim and the turn, the write's record and the settle waited too."""
    env = {**_app_env(worker_env, server_url), "NRLLM_OPENAI_API_KEY": "sk-test-not-a-real-key"}
    plan = [{"calls": [NOTIFY]}, {"answer": "sent {take}"}]
    request = request_for("drifting" if model else "scripted", plan, ["send_notification"])
    with _database_default_off(server_url):
        run_id, wal_writer, worker = _run_with_the_wal_writer_stalled(
            workers, server_url, env, request, burst=True
        )
        _output_of(worker)
        os.kill(wal_writer, signal.SIGKILL)  # the crash, once the run has ended
        wait_until(lambda: _restarted_without(server_url, wal_writer), what="crash recovery")
    expected = {
        "status": "completed",
        "fence": "",
        "output": "sent 2" if model else "sent same",
        "steps": ["request", "llm", "tool", "llm"],
    }
    assert _run(server_url, run_id, *expected) == expected


#: An operator tightens a tool's approval policy, as the admin and the API do.
TIGHTEN = """
from django.contrib.auth import get_user_model
from tools.approval_settings import set_approval_policy
from tools.models import ToolSetting
operator, _ = get_user_model().objects.get_or_create(username="tightener", is_superuser=True)
setting = ToolSetting.objects.get(name="send_notification")
print(set_approval_policy(setting, operator, "{policy}").ok)
"""


def _approval_of_send_notification(url: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT approval FROM tools_toolsetting WHERE name = 'send_notification'"
        ).fetchone()[0]


def test_with_the_database_default_off_a_tightened_approval_policy_survives_a_crash(
    server_url,  # noqa: F811
    worker_env,
):
    """An operator's change of a tool's approval policy reaches disk before
    they are told it is done: a crash right after it does not let the tool's
    next calls run unattended (G14)."""
    env = _app_env(worker_env, server_url)
    _manage(env, "shell", "-c", TIGHTEN.format(policy="default"))
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # the operator and the setting are on disk
    with _database_default_off(server_url):
        wal_writer = _stall_wal_writer(server_url)
        assert _manage(env, "shell", "-c", TIGHTEN.format(policy="required")).endswith("True")
        assert _approval_of_send_notification(server_url) == "required"
        os.kill(wal_writer, signal.SIGKILL)  # the crash, once the operator saw it done
        wait_until(lambda: _restarted_without(server_url, wal_writer), what="crash recovery")
    assert _approval_of_send_notification(server_url) == "required"
