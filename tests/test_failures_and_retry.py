"""G8 (the part in the core): one classifier, and what a queued failure becomes."""

import httpx
import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError

from runs.models import DeadLetter
from runs.models.vocabulary import FailureClass
from runs.providers import ProviderError
from runs.providers.failures import classify, is_retryable
from runs.runtime import enqueue
from runs.runtime.errors import AuditPersistenceFailed
from runs.runtime.retry import decide_retry
from tests.helpers import answer, call, retried_when_due, scripted
from tools.models import Note


@pytest.mark.parametrize(
    ("error", "failure_class"),
    [
        *[(ProviderError("x", failure_class=cls), cls) for cls in FailureClass.values],
        (ConnectionRefusedError(), "connection"),
        (TimeoutError(), "connection"),
        (httpx.ConnectError("x"), "connection"),
        (redis.exceptions.ConnectionError("x"), "connection"),
        (OperationalError("x"), "connection"),
        (InterfaceError("x"), "connection"),
        (ImproperlyConfigured("x"), "configuration"),
        (AuditPersistenceFailed("x"), "unknown"),
        (ValueError("x"), "unknown"),
        (ProviderError("x", failure_class="made_up"), "unknown"),
    ],
)
def test_classifier(error, failure_class):
    assert classify(error) == failure_class


def test_retryable_classes():
    retryable = {cls for cls in FailureClass.values if is_retryable(cls)}
    assert retryable == {"connection", "rate_limit", "server_error", "circuit_open"}


@pytest.mark.parametrize(
    ("failure_class", "fence", "count", "expected"),
    [
        ("server_error", "", 0, (True, "")),
        ("server_error", "idempotent_write", 0, (True, "")),
        ("server_error", "non_idempotent_write", 0, (False, "write_interrupted")),
        ("auth", "", 0, (False, "not_retryable")),
        ("unknown", "non_idempotent_write", 0, (False, "not_retryable")),
        ("unknown", "", 0, (False, "not_retryable")),
        ("connection", "", 3, (False, "retries_exhausted")),
    ],
)
def test_retry_decision(failure_class, fence, count, expected):
    decision = decide_retry(
        failure_class=failure_class, pending_effect=fence, requeue_count=count, max_requeues=3
    )
    assert (decision.requeue, decision.dead_letter_reason) == expected


def test_backoff_grows_and_honours_retry_after():
    delays = [
        decide_retry(
            failure_class="rate_limit", pending_effect="", requeue_count=n, max_requeues=9
        ).delay_seconds
        for n in range(3)
    ]
    assert delays == [2, 4, 8]
    assert (
        decide_retry(
            failure_class="rate_limit",
            pending_effect="",
            requeue_count=0,
            max_requeues=9,
            retry_after=30,
        ).delay_seconds
        == 30
    )


@pytest.mark.django_db(transaction=True)
def test_a_non_retryable_failure_dead_letters_a_queued_run():
    agent_run = enqueue(scripted({"error": "auth"}))
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason, agent_run.failure_class) == (
        "failed",
        "not_retryable",
        "auth",
    )
    assert DeadLetter.objects.get(run=agent_run).reason == "not_retryable"


@pytest.mark.django_db(transaction=True)
def test_a_retry_resumes_after_the_recorded_steps_and_asks_only_for_the_next_turn(settings):
    Note.objects.create(slug="a", body="b")
    agent_run = enqueue(
        scripted(
            call("upsert_note", slug="a", body="c"),
            {"error": "server_error", "attempts": 1},
            answer("done"),
            tools=["upsert_note"],
        )
    )
    retried_when_due()
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.requeue_count, agent_run.lease_token) == ("completed", 1, 2)
    steps = list(agent_run.steps.values_list("lease_token", "kind"))
    assert steps == [
        (1, "request"),
        (1, "llm"),
        (1, "tool"),
        (2, "request"),
        (2, "resume"),
        (2, "llm"),
    ]
    resume = agent_run.steps.get(kind="resume").result
    assert (resume["resumed_after"], resume["model_turns"], resume["tool_results"]) == (3, 1, 1)
    assert resume["writes"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_retryable_failure_past_the_budget_is_dead_lettered(settings):
    settings.NRLLM_MAX_REQUEUES = 1
    agent_run = enqueue(scripted({"error": "connection"}))
    retried_when_due()
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason, agent_run.requeue_count) == (
        "failed",
        "retries_exhausted",
        1,
    )


@pytest.mark.django_db(transaction=True)
def test_a_retry_replays_a_recorded_write_instead_of_repeating_it(http_server):
    agent_run = enqueue(
        scripted(
            call("post_webhook", url=http_server.url("/hook"), payload={"n": 1}),
            {"error": "server_error", "attempts": 1},
            answer("done"),
            tools=["post_webhook"],
        )
    )
    retried_when_due()
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.requeue_count) == ("completed", 1)
    assert len(http_server.posts()) == 1
    # Replayed from the journal, not copied into a step of its own.
    (write,) = agent_run.steps.filter(kind="tool")
    assert (write.lease_token, write.effect) == (1, "non_idempotent_write")
    assert write.idempotency_key == http_server.posts()[0].headers["Idempotency-Key"]
