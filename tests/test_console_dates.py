"""Dates and moments written one way across the console (issue #47): every
page an operator reads — the runs list, a run's page and its history, the
approvals inbox, the dead letters and one of them, the failed write
audits, the reconciliations, the daily spends and their date drill-down,
the overview — writes a day as ``2026-12-05`` and a moment as
``2026-12-05 14:03:07 UTC`` (to the second, with its zone; a step's to
the microsecond), never Django's English ("Dec. 5, 2026, 2:03 p.m.",
"December 2026") nor ISO's ``T``. A time of day alone (``14:03:07``) is
left where its date is the page's, as the trace's *at* and a message's
clock, a chart's axis ticks abbreviate (their bars' titles do not), and a
record shown as stored (a step's JSON) keeps its own.

Read from each page's text and its tooltips (``title``, ``aria-label``)."""

import re
from datetime import timedelta
from decimal import Decimal
from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest, CircuitTransition, DeadLetter, ProviderCircuit
from runs.models.last_passes import REAPER, LastPass
from runs.operators import actions as operator_actions
from runs.runtime import enqueue
from spend.models import DailySpend
from tests.helpers import answer, call, fresh, scripted
from tests.test_console import audit_failed_run
from tests.test_console_actions import auth_failed_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
#: The console's one format: a day, a moment (an hour's range), each alone.
DAY = r"\d{4}-\d\d-\d\d"
MOMENT = rf"{DAY} \d\d:\d\d:\d\d(?:\.\d{{6}})?(?:–\d\d:\d\d:\d\d)? [A-Z]{{2,5}}"
#: What looks like a date or a moment, however written.
MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
DATE_LIKE = re.compile(
    rf"{DAY}(?:[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:–\d\d:\d\d(?::\d\d)?)?(?: [A-Z]{{2,5}}\b)?)?"
    rf"|\b(?:{MONTHS})[a-z]*\.? \d{{1,4}}\b"  # "Dec. 5, 2026", "December 2026"
    r"|\b\d{1,2}(?::\d\d)? [ap]\.m\.|\bnoon\b|\bmidnight\b"
)


class _Shown(HTMLParser):
    """A page's text and tooltips, less its scripts and styles, a chart's
    axis ticks (an SVG ``<text>``: "14:00", "12-05" under a bar whose
    title has the whole moment) and a record shown as stored (JSON in a
    ``<pre>``: a step's result keeps its ISO 8601)."""

    SKIPPED = ("script", "style", "text", "pre")

    def __init__(self):
        super().__init__()
        self.parts, self._skipping = [], []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIPPED:
            self._skipping.append(tag)
        self.parts += [value for name, value in attrs if name in ("title", "aria-label") and value]

    def handle_endtag(self, tag):
        if self._skipping and self._skipping[-1] == tag:
            self._skipping.pop()

    def handle_data(self, data):
        if not self._skipping:
            self.parts.append(data)


def dates_on(page: str) -> list[str]:
    shown = _Shown()
    shown.feed(page)
    return [found[0] for part in shown.parts for found in DATE_LIKE.finditer(part)]


def test_every_console_page_writes_its_dates_and_moments_one_way(
    operator, operator_client, settings
):
    for codename in ("view_dailyspend", "view_writereconciliation"):
        operator.user_permissions.add(Permission.objects.get(codename=codename))
    # A run failed twice (a dead letter, a requeue in its history), a write
    # in doubt reconciled, a call approved and one waiting, a day's spend, a
    # provider circuit that opened, a reaper last seen an hour ago.
    failed = auth_failed_run()
    assert operator_actions.requeue(failed, operator, "key rotated?").ok
    doubt = audit_failed_run()
    in_doubt = audit_failed_run()
    assert operator_actions.reconcile(doubt, operator, "applied", "it landed").ok
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "non_idempotent_write"  # as shipped
    notify = call("send_notification", recipient="oncall", message="Failover at 22:00 UTC")
    tools = ["send_notification"]
    approved = enqueue(scripted(notify, answer("Sent."), tools=tools, prompt="Tell on-call"))
    (approval,) = ApprovalRequest.objects.filter(run=approved)
    assert approval_actions.approve(approval, operator, digest=approval.digest, note="ok").ok
    enqueue(scripted(notify, answer("Sent."), tools=tools, prompt="Tell on-call again"))
    now = timezone.now()
    DailySpend.objects.create(
        day=now.date(), submitter=operator.pk, provider="openai", model="gpt-4o", shard=0,
        turns=2, input_tokens=1200, output_tokens=300, cost=Decimal("0.00054"),
    )  # fmt: skip
    circuit = ProviderCircuit.objects.create(key="https://api.example/v1 gpt-4o", state="open")
    ProviderCircuit.objects.filter(pk=circuit.pk).update(opened_at=now - timedelta(minutes=3))
    CircuitTransition.objects.create(circuit=circuit, from_state="closed", to_state="open")
    LastPass.objects.create(
        name=REAPER, at=now - timedelta(hours=1), process="host:1", every_seconds=10
    )
    (dead_letter, *_) = DeadLetter.objects.filter(run=failed)
    pages = [
        RUNS,
        f"{RUNS}{failed.pk}/change/",
        f"{RUNS}{failed.pk}/history/",
        f"{RUNS}{fresh(approved).pk}/change/",
        f"{RUNS}{in_doubt.pk}/change/",
        f"{RUNS}approvals/",
        f"{RUNS}write-audits/",
        "/admin/runs/deadletter/",
        f"/admin/runs/deadletter/{dead_letter.pk}/change/",
        "/admin/runs/writereconciliation/",
        "/admin/spend/dailyspend/",
        f"/admin/spend/dailyspend/?day__year={now.year}&day__month={now.month}",
        "/admin/",
    ]

    written = {}
    for url in pages:
        response = operator_client.get(url)
        assert response.status_code == 200, url
        written[url] = dates_on(response.content.decode())

    one_way = re.compile(f"{MOMENT}|{DAY}")
    other_ways = {
        url: [date for date in dates if not one_way.fullmatch(date)]
        for url, dates in written.items()
    }
    assert not any(other_ways.values()), other_ways
    # Each page writes some: a page whose dates the pattern missed proves nothing.
    assert all(written.values()), written
    # The ones Django's admin formats itself: a date column, its drill-down,
    # a circuit's moment, an object's history.
    assert any(re.fullmatch(DAY, date) for date in written["/admin/spend/dailyspend/"])
    assert re.search(rf"\b{now:%Y-%m}\b", operator_client.get(pages[-2]).content.decode())
