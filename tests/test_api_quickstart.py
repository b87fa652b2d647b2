"""docs/api.md's quickstart, as written (#47): its shell steps run against
a live server holding the demo — the token made by the management
command, the run started with curl, followed, approved and completed —
and its Python signature check accepts a body the runtime really signed
and delivered, and nothing else. So the quickstart cannot drift from the
app."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from agents.starting import enqueue
from runs.models import AgentRun
from tests.helpers import ROOT
from tests.webhook_receiver import SECRET

pytestmark = pytest.mark.django_db(transaction=True)

#: Where the quickstart's shell steps send their requests: ``make run``'s.
DOCUMENTED_SERVER = "http://127.0.0.1:8000"


def quickstart_blocks(language: str) -> list[str]:
    """The ``language`` code blocks of docs/api.md's quickstart, dedented
    out of their list items, in order."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = re.search(r"^## Quickstart\n(.*?)^## ", text, re.S | re.M)
    assert section, "docs/api.md has no quickstart"
    blocks = re.findall(rf"^( *)```{language}\n(.*?)^\1```$", section[1], re.S | re.M)
    assert blocks, f"the quickstart has no {language} block"
    return [
        "".join(line.removeprefix(indent) for line in code.splitlines(keepends=True))
        for indent, code in blocks
    ]


def test_the_quickstarts_shell_steps_run_against_the_demo_as_written(
    live_server, approvals, worker_env
):
    call_command("seed_demo", verbosity=0)
    get_user_model().objects.create_superuser("admin", password="quickstart")
    script = "\n".join(quickstart_blocks("sh")).replace(DOCUMENTED_SERVER, live_server.url)
    assert script.count("curl ") >= 5 and "create_api_token admin" in script
    # ``python`` as the reader's shell finds it: this interpreter.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=ROOT,
        env={**worker_env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "waiting_for_approval", done.stdout
    assert '"tool_name":"read_note"' in done.stdout and '"tool_name":"upsert_note"' in done.stdout
    assert lines[-3:] == [
        "approved; the run goes back to the queue",
        "completed",
        "Release notes updated and the team notified.",
    ], lines
    agent_run = AgentRun.objects.get(submitted_by__username="admin", submitted_via="api")
    assert (agent_run.status, agent_run.agent_version.agent.name) == ("completed", "release-notes")


def test_the_quickstarts_signature_check_takes_a_delivered_body_and_nothing_else(
    receiver,  # noqa: F811 (the fixture imported above)
):
    namespace = {}
    (snippet,) = quickstart_blocks("python")
    exec(snippet, namespace)  # noqa: S102 (the documentation's own code, under test)
    signed_by_nrllm = namespace["signed_by_nrllm"]
    receiver.start()
    agent_run = enqueue(
        {
            "prompt": "Say done",
            "tools": [],
            "provider": {"kind": "scripted", "turns": [{"content": "done"}]},
            "webhook": receiver.url(),
        }
    )
    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    ((headers, body),) = receiver.posts
    signature = headers["x-nrllm-signature-256"]

    assert signed_by_nrllm(body, signature, SECRET) is True
    assert signed_by_nrllm(body.replace(b"done", b"DONE"), signature, SECRET) is False
    assert signed_by_nrllm(body, signature, "another-secret") is False
    assert signed_by_nrllm(body, "sha256=" + "0" * 64, SECRET) is False
