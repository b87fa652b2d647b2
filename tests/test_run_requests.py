"""Bad requests are refused with a message naming the problem, storing nothing."""

import io
import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from runs.models import AgentRun, RunStep
from runs.runtime import enqueue, run
from runs.runtime.run_request import InvalidRunRequest
from tests.conftest import ROOT
from tests.helpers import answer, scripted
from tools.models import ToolSetting

pytestmark = pytest.mark.django_db

GOOD = scripted(answer("hi"), tools=["read_note"])


def with_(**changes):
    request = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is ...:
            request.pop(key)
        else:
            request[key] = value
    return request


@pytest.mark.parametrize(
    ("request_data", "message"),
    [
        ([], 'request: [] is not of type "object"'),
        (with_(prompt=...), '"prompt" is a required property'),
        (with_(prompt=""), 'prompt: "" should be non-empty'),
        (with_(prompt=7), 'prompt: 7 is not of type "string"'),
        (with_(extra=1), '"extra" was unexpected'),
        (with_(tools="read_note"), 'tools: "read_note" is not of type "array"'),
        (with_(tools=["read_note", "nope"]), 'unknown tool(s) ["nope"]'),
        (with_(tools=["read_note", "read_note"]), "has non-unique elements"),
        (with_(provider={"kind": "gpt"}), 'unknown provider "gpt"'),
        (with_(provider=...), '"provider" is a required property'),
        (with_(provider={"kind": "scripted"}), 'provider: "turns" is a required property'),
        (with_(provider={"kind": "scripted", "turns": [{"bogus": 1}]}), "provider/turns/0"),
        (
            with_(provider={"kind": "scripted", "turns": [{"error": "meltdown"}]}),
            "provider/turns/0",
        ),
        (with_(max_iterations="3"), 'max_iterations: "3" is not of type "integer"'),
        (with_(max_iterations=0), "max_iterations: 0 is less than the minimum of 1"),
        (with_(max_iterations=21), "above the limit of 20 (NRLLM_MAX_ITERATIONS)"),
    ],
)
def test_invalid_requests_are_refused_and_store_nothing(request_data, message):
    for start in (enqueue, run):
        with pytest.raises(InvalidRunRequest) as refused:
            start(request_data)
        assert message in str(refused.value)
    assert AgentRun.objects.count() == 0 and RunStep.objects.count() == 0


def test_a_disabled_tool_is_refused():
    ToolSetting.objects.filter(name="read_note").update(enabled=False)
    with pytest.raises(InvalidRunRequest, match=r'disabled by an operator: \["read_note"\]'):
        enqueue(GOOD)
    assert AgentRun.objects.count() == 0


def test_enqueue_run_command_prints_the_run_id(tmp_path, django_capture_on_commit_callbacks):
    path = tmp_path / "request.json"
    path.write_text(json.dumps(GOOD))
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("enqueue_run", str(path), stdout=out)
    agent_run = AgentRun.objects.get()
    assert out.getvalue().strip() == str(agent_run.pk)
    # Without REDIS_URL the run executed in-process when enqueued.
    assert agent_run.status == "completed"


@pytest.mark.django_db(transaction=True)
def test_run_agent_command_reads_stdin_and_prints_the_outcome(worker_env):
    completed = subprocess.run(
        [sys.executable, "manage.py", "run_agent", "-"],
        cwd=ROOT,
        env=worker_env,
        input=json.dumps(GOOD),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(completed.stdout)
    assert outcome["status"] == "completed" and outcome["output"] == "hi"
    assert AgentRun.objects.get(pk=outcome["id"]).mode == "interactive"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "{not json",
            "is not valid JSON: Expecting property name enclosed in double quotes "
            "(line 1, column 2)",
        ),
        (json.dumps(with_(tools=["nope"])), 'invalid run request: tools: unknown tool(s) ["nope"]'),
    ],
)
@pytest.mark.parametrize("command", ["enqueue_run", "run_agent"])
def test_commands_refuse_bad_files_naming_the_problem(tmp_path, command, content, message):
    path = tmp_path / "request.json"
    path.write_text(content)
    with pytest.raises(CommandError) as refused:
        call_command(command, str(path))
    assert message in str(refused.value)
    assert AgentRun.objects.count() == 0


def test_commands_name_a_missing_file():
    with pytest.raises(CommandError, match="cannot read /no/such/file.json: No such file"):
        call_command("enqueue_run", "/no/such/file.json")
