"""The shared run queries: one definition of a write in doubt, for a queryset
(admin filter, API filter, metrics) and for one run (the API's field)."""

import pytest

from runs.models import AgentRun, WriteReconciliation
from runs.selectors import is_write_in_doubt, writes_in_doubt

pytestmark = pytest.mark.django_db


def make_run(status, fence=""):
    return AgentRun.objects.create(
        request={"prompt": "p"}, prompt="p", status=status, pending_effect=fence
    )


def test_a_write_in_doubt_is_the_same_for_a_queryset_and_for_one_run(operator):
    in_doubt = make_run("failed", "non_idempotent_write")
    reconciled = make_run("failed", "non_idempotent_write")
    WriteReconciliation.objects.create(
        run=reconciled, outcome="not_applied", note="checked", operator=operator
    )
    in_progress = make_run("running", "non_idempotent_write")  # a write under way
    idempotent = make_run("failed", "idempotent_write")  # safe to run again
    cancelled = make_run("cancelled", "non_idempotent_write")
    make_run("completed")

    runs = AgentRun.objects.select_related("reconciliation")
    by_row = {run.pk for run in runs if is_write_in_doubt(run)}
    by_query = set(writes_in_doubt(AgentRun.objects.all()).values_list("pk", flat=True))
    assert by_row == by_query == {in_doubt.pk, cancelled.pk}
    assert {reconciled.pk, in_progress.pk, idempotent.pk}.isdisjoint(by_row)
