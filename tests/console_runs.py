"""Runs of each kind an operator meets, for the browser tests of the
console's pages at a laptop's and a desktop's size (test_browser_laptop.py):
a failed run, a write in doubt, a run waiting for approval, completed ones
with long prompts (one unbroken), and a page of failed runs alike."""

from decimal import Decimal

import pytest

from agents.models import Agent, AgentVersion
from runs.models import AgentRun
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, scripted

#: Ids, keys and digests do not break at spaces: they must wrap anyway.
HEX = "5099e50086331ecde38760824" * 4
LONG_PROMPT = (
    "Go through every incident note of the last quarter, group them by the "
    "service they hit and summarise each group for the weekly report"
)
ROTA_PROMPT = (
    "Read the postmortems of the week, list the follow-ups still open and who "
    "owns each of them, then draft the reminder for the team's channel"
)


@pytest.fixture(name="runs_of_each_kind")
def runs_of_each_kind_fixture():
    """A failed run (auth), a write in doubt, a waiting run, and completed
    ones with long prompts, one unbroken: what the issue's screen showed."""
    failed = enqueue(
        scripted(
            call("search_notes", query=HEX),
            {"error": "auth"},
            tools=["search_notes"],
            prompt="Summarise the incidents",
        )
    )
    with step_inserts_refused("send_notification"):
        enqueue(
            scripted(
                call("send_notification", recipient="oncall", message="disk full"),
                answer(),
                tools=["send_notification"],
                prompt="Page on-call about the disk",
            )
        )
    # The suite's settings ask no approval; this request asks one itself.
    waiting = enqueue(
        {
            **scripted(
                call("send_notification", recipient="oncall", message="Failover at 22:00 UTC"),
                answer("Paged."),
                tools=["search_notes", "send_notification"],
                prompt="Tell on-call the database failover starts at 22:00 UTC",
            ),
            "require_approval": ["send_notification"],
        }
    )
    enqueue(scripted(answer("Done."), tools=["search_notes"], prompt=LONG_PROMPT))
    enqueue(scripted(answer("Found."), tools=["search_notes"], prompt=f"Find {HEX}"))
    assert fresh(waiting).status == RunStatus.WAITING_FOR_APPROVAL
    return fresh(failed), fresh(waiting)


def more_runs(submitter) -> None:
    """Twenty failed runs with long prompts and errors, by ``submitter``,
    every other one started from an agent (the others spent before they
    failed): a list a page long."""
    agent = Agent.objects.create(name="incident-summariser")
    version = AgentVersion.objects.create(
        agent=agent, number=3, provider={"kind": "scripted"}, max_iterations=5
    )
    AgentRun.objects.bulk_create(
        AgentRun(
            request={"provider": {"kind": "openai", "model": "gpt-4o-mini-2024-07-18"}},
            prompt=f"({number}) {ROTA_PROMPT}",
            status=RunStatus.FAILED,
            termination_reason="not_retryable",
            failure_class="auth",
            error_type="ProviderError",
            error_message="the provider refused the key: " + HEX,
            mode="queued",
            submitted_by=submitter,
            agent_version=version if number % 2 else None,
            prompt_tokens=0 if number % 2 else 41200,
            completion_tokens=0 if number % 2 else 3300,
            cost=Decimal(0 if number % 2 else "0.012345"),
        )
        for number in range(20)
    )
