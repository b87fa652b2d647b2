"""Bulk actions refuse what would act on more than the operator meant,
and change nothing: bad input to ``POST /api/runs/bulk/`` is a 400 naming
its field, an empty filter value is never read as "every run" (issue #47),
neither in the API nor in the console's "select all", and more runs than
``MAX_RUNS`` matching is refused whole."""

import pytest

from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.models.vocabulary import RunStatus
from runs.operators import bulk
from tests.helpers import fresh
from tests.test_bulk_actions import (
    BULK,
    RUNS,
    UNKNOWN,
    completed_run,
    operator_steps,
    queued_runs,
)
from tests.test_console_actions import auth_failed_run, messages_on

pytestmark = pytest.mark.django_db(transaction=True)


EMPTY = "Nothing was done: the list's address gives the filter {parameter!r} no value "
UNKNOWN_VALUE = "Nothing was done: the list's filter {parameter!r} does not take the value "


@pytest.mark.parametrize(
    ("query", "parameter", "refused", "letters_query"),
    [
        ("tool=", "tool", EMPTY + "(?tool=)", "state="),
        ("status__exact=queued&write_in_doubt=", "write_in_doubt", EMPTY, "state="),
        ("requeues=%20", "requeues", EMPTY, "state="),
        ("status=", "status", EMPTY, "state="),
        # The API's spelling of the filter: the list's is "yes".
        (
            "write_in_doubt=true",
            "write_in_doubt",
            UNKNOWN_VALUE + "'true' (?write_in_doubt=true)",
            "state=closed",
        ),
        ("status__exact=queued&requeues=7", "requeues", UNKNOWN_VALUE + "'7'", "state=closed"),
        ("lease=lost", "lease", UNKNOWN_VALUE + "'lost'", "state=closed"),
    ],
)
def test_select_all_under_a_filter_the_list_reads_as_none_is_refused_naming_it(
    operator_client, query, parameter, refused, letters_query
):
    """A list filter reads an empty value (``?tool=``) or one it does not
    know (``?write_in_doubt=true``, the API's word for the list's "yes") as
    no filter at all: "select all" there would have taken every run for
    what the address seemed to narrow (issue #47). Refused, naming the
    parameter (and the value); the dead letters' "select all" likewise.
    Rows ticked one by one, and a value the filter takes, act as ever."""
    queued = [transitions.create_queued_run({"prompt": "p", "tools": []}, "p") for _ in "ab"]
    completed_run()
    across = {
        "action": "cancel_selected",
        "select_across": "1",
        "index": "0",
        "_selected_action": [queued[0].pk],
    }

    response = operator_client.post(f"{RUNS}?{query}", across, follow=True)

    (message,) = messages_on(response)
    assert message.startswith(refused.format(parameter=parameter)), message
    assert '"all matching" would not be narrowed by it.' in message
    assert 'id="bulk-counts"' not in response.content.decode()
    assert {fresh(run).status for run in queued} == {RunStatus.QUEUED}
    # Their runs' requeue, their dismissal: neither done.
    letter = DeadLetter.objects.get(run=auth_failed_run())
    for action in ("requeue_selected", "dismiss_selected"):
        letters = operator_client.post(
            f"/admin/runs/deadletter/?{letters_query}",
            {**across, "action": action, "_selected_action": [letter.pk]},
            follow=True,
        )
        (message,) = messages_on(letters)
        assert message.startswith(refused.format(parameter="state")[:50]), message
    assert DeadLetter.objects.get(pk=letter.pk).resolved_at is None
    if parameter == "tool":
        ticked = {"action": "cancel_selected", "_selected_action": [queued[0].pk]}
        page = operator_client.post(f"{RUNS}?{query}", ticked).content.decode()
        assert "Will cancel 1 (of 1 run)." in page
    # A value the filter takes narrows as ever: the preview of the queued runs.
    page = operator_client.post(f"{RUNS}?status__exact=queued&requeues=0", across)
    assert "Will cancel 2 (of 2 runs)." in page.content.decode()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "delete", "ids": [UNKNOWN]}, "action"),
        ({"action": "requeue"}, "ids"),
        ({"action": "requeue", "ids": [], "preview": True}, "ids"),
        ({"action": "requeue", "ids": ["not-a-uuid"]}, "ids"),
        ({"action": "requeue", "ids": "0b6f1d2e-5c3a-4f8e-9d21-7a4b3c2d1e0f"}, "ids"),
        ({"action": "requeue", "ids": [f"{n:032x}" for n in range(201)]}, "ids"),
        (
            {"action": "requeue", "ids": [UNKNOWN], "filter": {}},
            "ids",
        ),
        ({"action": "requeue", "ids": [UNKNOWN], "seen": {UNKNOWN: "failed"}}, "seen"),
        ({"action": "requeue", "ids": [UNKNOWN], "seen": {"x": "failed:3"}}, "seen"),
        ({"action": "cancel", "filter": {"colour": "red"}}, "filter"),
        ({"action": "cancel", "filter": {"status": "lost"}}, "filter"),
        ({"action": "cancel", "filter": {"tool": "a\x00b"}}, "filter"),
        ({"action": "cancel", "filter": {"tool": ["x"]}}, "filter"),
        ({"action": "cancel", "filter": {"created_after": "yesterday"}}, "filter"),
        ({"action": "cancel", "filter": {"status": "queued"}, "colour": "red"}, "colour"),
        ({"action": "cancel", "filter": {"status": "queued"}, "note": 5}, "note"),
    ],
)
def test_bad_input_to_a_bulk_action_is_a_400_naming_the_field_and_changes_nothing(api, body, field):
    queued = transitions.create_queued_run({"prompt": "p", "tools": []}, "p")

    response = api.post(BULK, body, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid"
    assert field in response.json()["errors"], response.json()
    assert fresh(queued).status == RunStatus.QUEUED


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"status": ""}, "status"),
        ({"created_after": ""}, "created_after"),
        ({"status": "queued", "created_before": "  "}, "created_before"),
        ({"tool": "\t"}, "tool"),
        ({"termination_reason": None}, "termination_reason"),
        ({"failure_class": []}, "failure_class"),
        ({"write_in_doubt": "maybe"}, "write_in_doubt"),
    ],
)
def test_an_empty_filter_value_is_a_400_naming_it_never_every_run(api, value, field):
    """The runs list reads an empty value as no filter at all: a bulk
    action given one would have cancelled every run (issue #47)."""
    queued = [transitions.create_queued_run({"prompt": "p", "tools": []}, "p") for _ in "ab"]

    for preview in (True, False):
        body = {"action": "cancel", "filter": value, "preview": preview}
        response = api.post(BULK, body, format="json")

        assert response.status_code == 400, response.content
        assert list(response.json()["errors"]["filter"]) == [field], response.json()
        assert response.json()["detail"].startswith(f"filter: {field}: "), response.json()
        assert "every run" in response.json()["detail"]
    assert {fresh(run).status for run in queued} == {RunStatus.QUEUED}
    assert operator_steps(queued[0]) == 0


def test_more_runs_than_the_cap_matching_a_filter_is_a_400_and_changes_nothing(api):
    queued_runs(bulk.MAX_RUNS + 1)

    response = api.post(BULK, {"action": "cancel", "filter": {"status": "queued"}}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"filter: more than {bulk.MAX_RUNS} runs match; one bulk action takes at most "
        f"{bulk.MAX_RUNS}: narrow the filter "
        "(created_after, created_before)"
    )
    assert AgentRun.objects.filter(status=RunStatus.QUEUED).count() == bulk.MAX_RUNS + 1
