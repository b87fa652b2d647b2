"""G12's faithful replay: what a model or a tool produced is made, as it
arrives, what the journal will give back (``tools.canonical``), so a resumed
attempt continues the very conversation the first one had and a call keeps
its idempotency key."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs import transitions
from runs.models import AgentRun, RunStep
from runs.models.faults import step_inserts_refused
from runs.operators import actions as operator_actions
from runs.runtime import enqueue
from tests.drifting_model import openai_request
from tools.canonical import as_journaled, storable_text
from tools.contract import idempotency_key_for

pytestmark = pytest.mark.django_db(transaction=True)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture
def lease():
    run = transitions.create_queued_run({"prompt": "p"}, "p")
    return transitions.claim(run.pk, "w", 60).lease


def test_a_journaled_value_comes_back_from_the_journal_as_it_went_in(lease):
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(value=JSON)
    def round_trip(value):
        journaled = as_journaled(value)
        step = {"kind": "llm", "result": {"content": "", "tool_calls": [], "value": journaled}}
        assert transitions.record_step(lease, 60, step, clear_fence=False).persisted
        stored = RunStep.objects.filter(run_id=lease.run_id).order_by("-sequence").first()
        back = stored.result["value"]
        assert back == journaled or (back != back and journaled != journaled)
        assert idempotency_key_for(lease.run_id, "1.0", "t", back) == idempotency_key_for(
            lease.run_id, "1.0", "t", journaled
        )
        assert as_journaled(back) == back  # already what the journal keeps

    round_trip()


@pytest.mark.parametrize(
    ("value", "journaled"),
    [
        (1e16, 10_000_000_000_000_000),
        (-0.0, 0.0),
        (0.1, 0.1),
        (1e-07, 1e-07),
        (float("nan"), "NaN"),
        (float("-inf"), "-Infinity"),
        ("a\x00b\ud800c", "a\ufffdb\ufffdc"),
        ({"k\x00": [1.5e300]}, {"k\ufffd": [int(15 * 10**299)]}),
    ],
)
def test_what_the_journal_cannot_keep_is_made_what_it_gives_back(value, journaled):
    assert as_journaled(value) == journaled
    assert storable_text("plain") == "plain"


def test_an_idempotent_write_whose_audit_failed_keeps_its_key_when_requeued(
    drifting_model, http_server, settings, operator
):
    """The model's arguments hold a number jsonb writes another way (1e16):
    the write's audit fails, an operator requeues, and the write runs again
    with the key it was fenced with, so the receiver can drop the repeat."""
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.IdempotentWebhook"]
    settings.NRLLM_MAX_REQUEUES = 0
    put = {
        "name": "put_webhook",
        "arguments": {
            "url": http_server.url("/put"),
            "payload": {"amount": 1e16, "text": "take {take}"},
        },
    }
    request = openai_request("pay", [{"calls": [put]}, {"answer": "paid"}], ["put_webhook"])
    with step_inserts_refused("put_webhook"):
        agent_run = enqueue(request)
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.error_type) == ("failed", "AuditPersistenceFailed")
    fenced_key = agent_run.pending_call["idempotency_key"]

    result = operator_actions.requeue(agent_run, operator, "db fixed")
    assert result.ok, result.detail
    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    keys = [r.headers["Idempotency-Key"] for r in http_server.received if r.path == "/put"]
    assert keys == [fenced_key, fenced_key]
