"""The shared run queries: one definition of a write in doubt, for a queryset
(admin filter, API filter, metrics) and for one run (the API's field)."""

import pytest
from django.contrib.auth.models import User

from runs.models import AgentRun, WriteReconciliation
from runs.selectors import is_write_in_doubt, writes_in_doubt

pytestmark = pytest.mark.django_db


def make_run(status, fence="", *, token=1, key="k1"):
    return AgentRun.objects.create(
        request={"prompt": "p"},
        prompt="p",
        status=status,
        pending_effect=fence,
        pending_call={"tool": "send_notification", "arguments": {}, "idempotency_key": key}
        if fence
        else None,
        lease_token=token,
    )


def reconcile(run, *, token, key):
    WriteReconciliation.objects.create(
        run=run,
        lease_token=token,
        idempotency_key=key,
        outcome="not_applied",
        note="checked",
        operator=User.objects.get(username="olivia"),
    )


def test_a_write_in_doubt_is_the_same_for_a_queryset_and_for_one_run(operator):
    in_doubt = make_run("failed", "non_idempotent_write")
    reconciled = make_run("failed", "non_idempotent_write")
    reconcile(reconciled, token=1, key="k1")
    in_progress = make_run("running", "non_idempotent_write")  # a write under way
    idempotent = make_run("failed", "idempotent_write")  # safe to run again
    cancelled = make_run("cancelled", "non_idempotent_write")
    make_run("completed")
    # A reconciliation settles the one write it was made for (issue 16).
    later_write = make_run("failed", "non_idempotent_write", token=2, key="k2")
    reconcile(later_write, token=1, key="k1")
    same_call_again = make_run("failed", "non_idempotent_write", token=3, key="k1")
    reconcile(same_call_again, token=2, key="k1")

    runs = AgentRun.objects.prefetch_related("reconciliations")
    by_row = {run.pk for run in runs if is_write_in_doubt(run)}
    by_query = set(writes_in_doubt(AgentRun.objects.all()).values_list("pk", flat=True))
    assert by_row == by_query == {in_doubt.pk, cancelled.pk, later_write.pk, same_call_again.pk}
    assert {reconciled.pk, in_progress.pk, idempotent.pk}.isdisjoint(by_row)
