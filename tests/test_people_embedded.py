"""G24 on the embedded default (SQLite, no Redis: `make run`), with real
`manage.py` processes: an answered question and a posted completion resume
the run through the embedded worker; an interactive run (`run_agent`) that
asks is finished by it once answered."""

import json
import uuid

import pytest

from tests.drifting_model import openai_request
from tests.embedded_processes import embedded_worker, progress, sqlite_rows
from tests.helpers import manage, sqlite_env, wait_until

STALLED = 60.0
TOOLS_ENV = "tests.deferred_tools.OpenTicket,tests.deferred_tools.LookUpTicket"
ASK = {"name": "ask_person", "arguments": {"question": "which host (take {take})?"}}
LOOK_UP = {"name": "look_up_ticket", "arguments": {"title": "who owns db-2"}}


@pytest.fixture
def env(tmp_path, fake_openai, migrated):
    database = tmp_path / "embedded.sqlite3"
    migrated(database)
    variables = sqlite_env(
        database,
        NRLLM_OPENAI_BASE_URL=fake_openai.base_url,
        NRLLM_OPENAI_API_KEY="sk-test-not-a-real-key",
        NRLLM_TOOLS=TOOLS_ENV,
        NRLLM_APPROVAL_REQUIRED_FOR="none",
    )
    return variables


def status(env, run_id):
    return sqlite_rows(
        env, "SELECT status, termination_reason FROM runs_agentrun WHERE id=?", run_id
    )[0]


def shell(env, code):
    done = manage("shell", "-c", code, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


ANSWER = (
    "from django.contrib.auth import get_user_model\n"
    "from runs.approvals.answers import answer\n"
    "from runs.models import ApprovalRequest\n"
    "q = ApprovalRequest.objects.get(status='pending', kind='question')\n"
    "u = get_user_model().objects.create_superuser('boss', password='pw')\n"
    "print(answer(q, u, digest=q.digest, answer='db-2').code)"
)
COMPLETE = (
    "from runs.approvals.answers import complete\n"
    "from runs.approvals.completions import signature_for\n"
    "from runs.models import ApprovalRequest\n"
    "r = ApprovalRequest.objects.get(status='pending', kind='deferred')\n"
    "print(complete(r.idempotency_key, signature_for(r.idempotency_key), {'result': 'alice'}).code)"
)


def test_an_answer_and_a_completion_resume_through_the_embedded_worker(env, drifting_model):
    plan = [{"calls": [ASK]}, {"calls": [LOOK_UP]}, {"answer": "done (take {take})"}]
    request = openai_request("ask then look up", plan, ["ask_person", "look_up_ticket"])
    with embedded_worker(env) as worker:
        enqueued = manage("enqueue_run", "-", env=env, stdin=json.dumps(request))
        assert enqueued.returncode == 0, enqueued.stderr[-2000:]
        run_id = uuid.UUID(enqueued.stdout.strip().splitlines()[-1]).hex
        signs = progress(env, worker, model=drifting_model)
        wait_until(
            lambda: status(env, run_id)[0] == "waiting_for_input",
            timeout=STALLED,
            progress=signs,
            what="the question",
        )
        assert shell(env, ANSWER) == "answered"
        wait_until(
            lambda: (
                sqlite_rows(
                    env,
                    "SELECT count(*) FROM runs_approvalrequest "
                    "WHERE kind='deferred' AND status='pending'",
                )[0][0]
                == 1
            ),
            timeout=STALLED,
            progress=signs,
            what="the hand-off",
        )
        assert shell(env, COMPLETE) == "completed"
        wait_until(
            lambda: status(env, run_id)[0] == "completed",
            timeout=STALLED,
            progress=signs,
            what="the end",
        )
    assert status(env, run_id) == ("completed", "completed")


def test_an_interactive_run_that_asks_is_finished_by_the_embedded_worker(env, drifting_model):
    plan = [{"calls": [ASK]}, {"answer": "done (take {take})"}]
    request = openai_request("interactive ask", plan, ["ask_person"])
    ran = manage("run_agent", "-", env=env, stdin=json.dumps(request))
    assert ran.returncode == 0, ran.stderr[-2000:]
    outcome = json.loads(ran.stdout[ran.stdout.index("{") :])
    assert outcome["status"] == "waiting_for_input", outcome
    run_id = uuid.UUID(outcome["id"]).hex
    with embedded_worker(env) as worker:
        assert shell(env, ANSWER) == "answered"
        wait_until(
            lambda: status(env, run_id)[0] == "completed",
            timeout=STALLED,
            progress=progress(env, worker, model=drifting_model),
            what="the interactive run's end",
        )
    assert status(env, run_id) == ("completed", "completed")
