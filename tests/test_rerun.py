"""G20: going back into a run never repeats a write unasked.

A rerun from a chosen model turn is a new run that replays the original's
journal before that turn and asks the model anew from it. Tried through the
API with real rqworkers, with the ``scripted`` provider and with a model that
words every answer differently: the replayed turns are never asked for
again, a non-idempotent write recorded after the turn refuses the rerun
until an operator with ``runs.rerun_past_write`` confirms it, and then the
new run waits for an approval before that write executes again.
"""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission

from agents.versions import save_agent
from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import AgentRun
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import RunStatus, StepKind
from runs.operators import actions as operator_actions
from runs.operators.rerun import rerun_from
from runs.operators.rerun_verdict import WriteAfter, rerun_verdict
from runs.reaper.retention import delete_whole_runs
from runs.runtime import enqueue
from tests.approval_requests import client_with, decide, pending
from tests.drifting_model import MODELS, NOTIFY, SEARCH, request_for, scripted_request
from tests.helpers import fresh, wait_until
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = ["search_notes", "send_notification"]
#: A read, a notification (a non-idempotent write), then the answer.
PLAN = [{"calls": [SEARCH]}, {"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]


def turns_of(run) -> list[int]:
    """The sequences of ``run``'s model turns, in order."""
    steps = run.steps.filter(kind=StepKind.LLM).order_by("sequence")
    return list(steps.values_list("sequence", flat=True))


def url(run, sequence) -> str:
    return f"/api/runs/{run.pk}/rerun-from/{sequence}/"


def ended(run_id, status=RunStatus.COMPLETED, what="the run"):
    wait_until(lambda: AgentRun.objects.get(pk=run_id).status == status, timeout=40, what=what)
    return AgentRun.objects.get(pk=run_id)


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_rerun_replays_the_turns_before_the_step_and_asks_before_repeating_a_write(
    model, workers, api, operator, approver, api_token
):
    original = enqueue(request_for("drifting" if model else "scripted", PLAN, TOOLS))
    workers.start()
    original = ended(original.pk, what="the original run")
    search_turn, notify_turn, answer_turn = turns_of(original)
    assert OutboxNotification.objects.count() == 1

    # From the notification's turn: the write after it refuses the rerun.
    verdict = api.get(url(original, notify_turn)).json()
    assert (verdict["allowed"], verdict["code"], verdict["past_write"]) == (
        False,
        "past_write",
        True,
    )
    (write,) = verdict["writes_after"]
    assert write == {
        "sequence": notify_turn + 1,
        "tool": "send_notification",
        "effect": "non_idempotent_write",
        "state": "executed",
        "run": None,
    }
    refused = api.post(url(original, notify_turn), {"note": "again"}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (409, "past_write")
    # Confirming takes a permission of its own.
    without = api.post(url(original, notify_turn), {"confirm_past_write": True}, format="json")
    assert without.status_code == 403
    assert "runs.rerun_past_write" in without.json()["detail"]
    assert AgentRun.objects.count() == 1

    operator.user_permissions.add(Permission.objects.get(codename="rerun_past_write"))
    made = api.post(
        url(original, notify_turn),
        {"confirm_past_write": True, "note": "the team list changed"},
        format="json",
    )
    assert made.status_code == 201, made.content
    rerun = AgentRun.objects.get(pk=made.json()["id"])
    assert (made.json()["rerun_of"], made.json()["rerun_from_sequence"]) == (
        str(original.pk),
        notify_turn,
    )
    # It goes live at the chosen turn, and the write it asks for again waits.
    rerun = ended(rerun.pk, RunStatus.WAITING_FOR_APPROVAL, "the rerun to wait")
    assert OutboxNotification.objects.count() == 1
    (approval,) = pending(rerun)
    assert approval.tool_name == "send_notification"
    assert decide(client_with(api_token(approver)), approval).status_code == 200
    rerun = ended(rerun.pk, what="the approved rerun")
    assert OutboxNotification.objects.count() == 2

    # From the final answer's turn, with another input: nothing to confirm.
    edited = {"input": original.prompt.replace("ship it", "ship it, politely")}
    again = api.post(url(original, answer_turn), edited, format="json")
    assert again.status_code == 201, again.content
    polite = ended(again.json()["id"], what="the second rerun")
    assert polite.prompt.startswith("ship it, politely")
    assert OutboxNotification.objects.count() == 2

    # Each rerun copied the turns before its step and counts none of their spend.
    for new_run, step in ((rerun, notify_turn), (polite, answer_turn)):
        copied = new_run.steps.exclude(replay_of=None).order_by("sequence")
        assert [s.replay_of for s in copied] == list(range(search_turn, step))
        live_turns = len(PLAN) - len([s for s in copied if s.kind == StepKind.LLM])
        assert new_run.total_tokens == original.total_tokens * live_turns // len(PLAN)
    if model is not None:
        # The replayed turns were never asked for again; the live ones were.
        assert model.requests_by_turn == {0: 1, 1: 2, 2: 3}
        assert polite.output != original.output

    # Linked both ways, and audited on both runs (G11).
    reruns = api.get(f"/api/runs/?rerun_of={original.pk}").json()["results"]
    assert {r["id"] for r in reruns} == {str(rerun.pk), str(polite.pk)}
    actions = [
        step.result["action"]
        for step in fresh(original).steps.filter(kind=StepKind.OPERATOR).order_by("sequence")
    ]
    assert actions == ["rerun_from", "rerun_from"]
    first = rerun.steps.get(sequence=1).result
    assert (first["action"], first["of_run"], first["operator"]) == (
        "rerun_of",
        str(original.pk),
        "olivia",
    )
    assert LogEntry.objects.filter(object_id=str(original.pk)).count() == 2


def test_a_rerun_is_refused_with_the_reason_and_bad_input_is_a_400_naming_the_field(
    api, viewer, api_token
):
    request = scripted_request("ship it", PLAN, TOOLS)
    original = enqueue(request)  # no queue: it runs here, on commit
    original = fresh(original)
    assert original.status == RunStatus.COMPLETED
    search_turn, notify_turn, _ = turns_of(original)

    def refused(sequence, body=None):
        answer = api.post(url(original, sequence), body or {}, format="json")
        return answer.status_code, answer.json().get("code"), answer.json()

    assert refused(notify_turn + 1)[:2] == (409, "not_a_turn")  # a tool step
    assert refused(999)[:2] == (409, "not_a_turn")
    assert refused(search_turn, {"input": ""})[0] == 400
    assert "input" in refused(search_turn, {"input": ""})[2]["errors"]
    status, _, body = refused(search_turn, {"version": 2})
    assert status == 400 and "not started from an agent" in body["errors"]["version"][0]
    assert refused(search_turn, {"confirm_past_write": "perhaps"})[0] == 400
    assert "input" in refused(search_turn, {"input": "a\x00b"})[2]["errors"]
    assert "sequnce" in refused(search_turn, {"sequnce": 3})[2]["errors"]
    assert api.post(f"/api/runs/{original.pk}/rerun-from/x/", {}).status_code == 404

    # A viewer sees the verdict but may not rerun.
    as_viewer = client_with(api_token(viewer))
    assert as_viewer.get(url(original, search_turn)).json()["code"] == "past_write"
    assert as_viewer.post(url(original, search_turn), {}, format="json").status_code == 403

    # A stored request that no longer parses (here not even an object).
    AgentRun.objects.filter(pk=original.pk).update(request=["not", "a", "request"])
    for body in ({}, {"input": "again"}):
        status, code, _ = refused(search_turn, body)
        assert (status, code) == (409, "request_invalid"), body
    assert api.get(url(original, search_turn) + "?input=a").json()["code"] == "request_invalid"

    # An ended run only; nothing was stored by any refusal.
    queued = transitions.create_queued_run(original.request, original.prompt)
    assert refused_for(api, queued, 1)[:2] == (409, "status")
    assert AgentRun.objects.filter(rerun_of=original.pk).count() == 0
    assert AgentRun.objects.count() == 2


def refused_for(api, run, sequence):
    answer = api.post(url(run, sequence), {}, format="json")
    return answer.status_code, answer.json().get("code")


def test_the_console_reruns_from_a_step_with_the_verdict_first(
    operator, operator_client, viewer_client
):
    original = fresh(enqueue(scripted_request("ship it", PLAN, TOOLS)))
    _, notify_turn, _ = turns_of(original)
    page = operator_client.get(f"/admin/runs/agentrun/{original.pk}/change/").content.decode()
    rerun_url = f"/admin/runs/agentrun/{original.pk}/rerun-from/{notify_turn}/"
    assert page.count("rerun from here") == 3 and rerun_url in page
    viewer_page = viewer_client.get(f"/admin/runs/agentrun/{original.pk}/change/")
    assert "rerun from here" not in viewer_page.content.decode()
    assert viewer_client.get(rerun_url).status_code == 403

    # The verdict first: the write after the step, and who may confirm it.
    shown = operator_client.get(rerun_url).content.decode()
    assert "past_write" in shown and "send_notification" in shown
    assert "Confirming needs the permission <code>runs.rerun_past_write</code>" in shown
    form = {"input": original.prompt, "note": "again", "confirm_past_write": "on"}
    refused = operator_client.post(rerun_url, form).content.decode()
    assert "Not rerun: confirming a rerun past a non-idempotent write takes" in refused
    blank = operator_client.post(rerun_url, {**form, "input": ""}).content.decode()
    assert 'class="errorlist' in blank and AgentRun.objects.count() == 1

    operator.user_permissions.add(Permission.objects.get(codename="rerun_past_write"))
    made = operator_client.post(rerun_url, form)
    rerun = AgentRun.objects.get(rerun_of=original.pk)
    assert made.status_code == 302 and made["Location"].endswith(f"{rerun.pk}/change/")
    assert fresh(rerun).status == RunStatus.WAITING_FOR_APPROVAL  # ran here, on commit
    new_page = operator_client.get(made["Location"]).content.decode()
    # The copies are no attempt of the rerun's: its one attempt replayed them.
    assert "Attempts (1)" in new_page
    assert 'id="rerun-of"' in new_page and "copy of step" in new_page
    old_page = operator_client.get(f"/admin/runs/agentrun/{original.pk}/change/")
    assert str(rerun.pk)[:8] in old_page.content.decode()


def test_a_write_in_doubt_on_the_fence_counts_as_a_write_after_every_step(operator):
    with step_inserts_refused("send_notification"):  # its audit fails: in doubt
        original = fresh(enqueue(scripted_request("ship it", PLAN, TOOLS)))
    assert original.pending_effect == "non_idempotent_write"
    _, notify_turn = turns_of(original)
    verdict = rerun_verdict(original, notify_turn)
    assert (verdict.code, verdict.writes_after) == (
        "past_write",
        [WriteAfter(None, "send_notification", "non_idempotent_write", "in_doubt")],
    )
    assert "in doubt on the run's fence, may have landed" in verdict.reason
    assert operator_actions.reconcile(original, operator, "not_applied", "bounced").ok
    assert rerun_verdict(fresh(original), notify_turn).code == "safe"


def test_a_rerun_of_a_rerun_counts_the_writes_its_original_made_after_the_step(
    api, operator, operator_client
):
    """A rerun's copied turns (and its live turns) stand for the original's
    history: a rerun of the rerun from one of them could repeat what the
    original wrote after that point, and must ask for it as G20 says."""
    definition = {**scripted_request("", PLAN, TOOLS)}
    del definition["prompt"]
    save_agent("notifier", definition, user=operator, create=True)
    started = api.post(
        "/api/runs/", {"agent": "notifier", "version": 1, "input": "ship it"}, format="json"
    )
    original = AgentRun.objects.get(pk=started.json()["id"])
    _, notify_turn, _ = turns_of(original)
    operator.user_permissions.add(Permission.objects.get(codename="rerun_past_write"))
    # Fetched again, as a request does: a user caches its permissions.
    operator = type(operator).objects.get(pk=operator.pk)
    made = api.post(url(original, notify_turn), {"confirm_past_write": True}, format="json")
    rerun = fresh(AgentRun.objects.get(pk=made.json()["id"]))
    assert rerun.status == RunStatus.WAITING_FOR_APPROVAL
    assert operator_actions.cancel(rerun, operator, "not now").ok
    rerun = fresh(rerun)
    copied_search, live_notify = turns_of(rerun)
    assert delete_whole_runs([original.pk]) == 1  # retention may delete it first
    for step in (copied_search, live_notify):
        verdict = rerun_verdict(rerun, step, request_data=original.request)
        assert (verdict.code, [w.tool for w in verdict.writes_after]) == (
            "past_write",
            ["send_notification"],
        ), step
    page = operator_client.get(f"/admin/runs/agentrun/{rerun.pk}/rerun-from/{copied_search}/")
    assert f'of run <span title="{original.pk}">' in page.content.decode()
    # With the agent's version as it defines the request (without the
    # approval the first rerun added; the rerun's own version through the
    # API keeps its request, approval and all), confirmed: the write still
    # waits for an approval.
    again = rerun_from(
        fresh(rerun),
        copied_search,
        operator,
        request_data=original.request,
        confirm_past_write=True,
        submitted_via="api",
    )
    assert again.ok, again.detail
    assert "require_approval" not in original.request
    assert fresh(again.run).status == RunStatus.WAITING_FOR_APPROVAL
    assert OutboxNotification.objects.count() == 1


def test_a_rerun_whose_steps_the_database_refuses_stores_nothing_and_says_so(api, operator_client):
    """G11: a rerun and its steps are one transaction; the API answers 503
    and the console says nothing was changed — never a 500."""
    original = fresh(enqueue(scripted_request("ship it", PLAN, TOOLS)))
    _, _, answer_turn = turns_of(original)
    # Refused at the original's step (first), or at the copies (after the
    # new run's row): never a new run without its copies.
    with step_inserts_refused(kind=StepKind.OPERATOR):
        page = operator_client.post(
            f"/admin/runs/agentrun/{original.pk}/rerun-from/{answer_turn}/",
            {"input": original.prompt},
        )
        assert page.status_code == 200
        assert "nothing was changed" in page.content.decode()
    with step_inserts_refused(kind=StepKind.LLM):
        answer = api.post(url(original, answer_turn), {}, format="json")
        assert answer.status_code == 503, answer.content
    assert AgentRun.objects.count() == 1
    assert fresh(original).step_count == original.step_count


@pytest.mark.worker
def test_a_write_that_returned_late_counts_as_a_write_after_the_step_however_reconciled(
    settings, workers, operator
):
    """A write past its time limit is in doubt; what it returns later is a
    ``late_result`` step (G15). An operator who reconciled it ``not_applied``
    before it returned was wrong: it landed, and a rerun from before it
    could repeat it."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.tools_for_tests.SlowWrite"]
    slow = {"name": "slow_write", "arguments": {"seconds": 5}}
    original = enqueue(
        scripted_request("ship it", [{"calls": [slow]}, {"answer": "ok"}], ["slow_write"])
    )
    workers.start()
    original = ended(original.pk, RunStatus.FAILED, "the write to time out")
    assert (original.status, original.pending_effect) == ("failed", "non_idempotent_write")
    assert operator_actions.reconcile(original, operator, "not_applied", "it timed out").ok
    (turn,) = turns_of(original)
    assert rerun_verdict(fresh(original), turn).code == "safe"  # as the operator said
    wait_until(
        lambda: original.steps.filter(kind=StepKind.LATE_RESULT, error="").exists(),
        timeout=20,
        what="the write's late result",
    )
    verdict = rerun_verdict(fresh(original), turn)
    assert verdict.code == "past_write"
    assert [(w.tool, w.state) for w in verdict.writes_after] == [("slow_write", "returned_late")]


def test_a_rerun_past_a_call_of_a_tool_the_run_was_never_offered_is_not_refused_for_it():
    """A model that miswords a tool's name (``Send_Notification``) was told
    the tool is not offered; replaying that is what the original did, not a
    call the new run "could not have made". The write's own name, asked for
    after the step, still takes a confirmation."""
    misnamed = {**NOTIFY, "name": "Send_Notification"}
    plan = [{"calls": [misnamed]}, {"calls": [NOTIFY]}, {"answer": "sent"}]
    original = fresh(enqueue(scripted_request("ship it", plan, TOOLS)))
    _, notify_turn, answer_turn = turns_of(original)
    assert rerun_verdict(original, answer_turn).code == "safe"
    assert rerun_verdict(original, notify_turn).code == "past_write"


def test_a_rerun_counts_what_its_original_wrote_after_the_rerun_was_made(operator):
    """The original may go on after its rerun was made (requeued, a write
    approved): what it writes then is after the rerun's turns too."""
    asks = {**scripted_request("ship it", PLAN, TOOLS), "require_approval": ["send_notification"]}
    original = fresh(enqueue(asks))
    _, notify_turn = turns_of(original)
    assert operator_actions.cancel(original, operator, "not yet").ok
    rerun = rerun_from(fresh(original), notify_turn, operator, submitted_via="api").run
    assert operator_actions.cancel(fresh(rerun), operator, "not this one").ok

    assert operator_actions.requeue(fresh(original), operator, "go on").ok
    (request,) = pending(original)
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    assert OutboxNotification.objects.count() == 1  # the original sent it
    for step in turns_of(rerun):
        verdict = rerun_verdict(fresh(rerun), step)
        assert (verdict.code, [w.run for w in verdict.writes_after]) == (
            "past_write",
            [str(original.pk)],
        ), step
