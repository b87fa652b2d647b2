"""Demo data made by executing real scenarios through the runtime.

Every run is executed, nothing is written by hand. With the shipped
approval policy (``NRLLM_APPROVAL_REQUIRED_FOR=non_idempotent_write``) each
``send_notification`` waits for an operator: the demo decides those calls
through ``runs.approvals.actions``, as an operator does in the admin, under
a user of its own (``DEMO_APPROVER``), and leaves one waiting for whoever
opens the admin. People in the loop (G24): one run asks a person a question
and waits for the answer, and one call the demo approver edited waits for
its own approval. Without Redis the demo executes its runs itself, inline
(``executing_in_caller``): each decision executes the run on.

The scripted model of the demo reports tokens as a real one would, and the
demo prices it (``DEMO_PRICE``), so the runs, the overview and
``/api/usage/`` show spend; one run stops at its own token limit
(``budget_exhausted``, G17).

Two runs start from agents (G18), as a team would start them: the
completed one from ``release-notes``, the one left waiting from
``on-call``, whose instructions the demo then changes (version 2): the
waiting run keeps version 1.

Two teams share the deployment (G22): Operations (the default team,
renamed), whose runs these are, and Support, with an agent of its own
that may read notes and nothing else. Three members show the separation:
``olga`` holds every role in Operations, ``sam`` every role in Support,
and ``pat`` is a viewer in Operations and a runner and approver in
Support. They have no password of their own until ``ensure_admin``
creates the admin: it gives the members of ``DEMO_MEMBERS_GROUP`` the
admin's password (``make run`` prints it once).

Support's ``triage`` agent runs without a click too (G23): a schedule
every morning at 07:00 in Berlin, backfilled over the last two days, and
a trigger Alertmanager may POST to, sent one signed alert (twice: the
second is the same event, and starts nothing).

The output is a line per run (``make run`` prints how to log in after it):
what the runtime logs as it executes them, the failures the stories stage
included, is not printed (``-v 2`` prints it), and the fault the demo
injects is expected, not an error; any other error is printed as logged.
"""

import json
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from agents.management.commands._demo_log import told_by_the_summary
from agents.management.commands._demo_people import (  # noqa: F401 (the tests name them here)
    ASKING,
    EDITED,
    EDITED_ARGUMENTS,
    EDITED_NOTE,
    edit_as_the_demo_approver,
)
from agents.management.commands._demo_requests import notifying, with_usage
from agents.models import Agent
from agents.starting import enqueue, run
from agents.versions import save_agent
from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import ApprovalStatus, StepKind
from runs.queue.dispatch import executing_in_caller
from spend.models import ModelPrice
from teams.models import DEFAULT_TEAM_ID, Membership, Team
from teams.roles import Role
from tools.models import Note
from triggers import actions as schedule_actions
from triggers.events import receive
from triggers.models import EventTrigger, Schedule

#: The demo's team members (see the module's docstring); ``ensure_admin``
#: gives this group's members without a password the admin's.
DEMO_MEMBERS_GROUP = "demo team members"
#: (username, team slug, roles): every role when none is named.
DEMO_MEMBERS = (
    ("olga", "ops", ()),
    ("sam", "support", ()),
    ("pat", "ops", (Role.VIEWER,)),
    ("pat", "support", (Role.RUNNER, Role.APPROVER)),
)
#: Who the demo's decisions are recorded under. It may approve writes and
#: nothing else, and it has no usable password: nobody can log in as it, so
#: the demo documents no second password (the operator's is ``admin``'s).
DEMO_APPROVER = "demo-approver"

NOTIFY = {"recipient": "ops@example.org", "message": "Release notes updated."}

#: What the demo's scripted model costs per million tokens (made up: the
#: order of a mid-size hosted model's).
DEMO_PRICE = {
    "input_per_million": "2.50",
    "cached_input_per_million": "1.25",
    "output_per_million": "10.00",
}


COMPLETED = with_usage(
    {
        "prompt": "Update the release notes and tell the team.",
        "tools": ["read_note", "upsert_note", "send_notification"],
        "provider": {
            "kind": "scripted",
            "turns": [
                {"tool_calls": [{"name": "read_note", "arguments": {"slug": "release-notes"}}]},
                {
                    "tool_calls": [
                        {
                            "name": "upsert_note",
                            "arguments": {
                                "slug": "release-notes",
                                "body": "v2: leases and fences.",
                            },
                        }
                    ]
                },
                {"tool_calls": [{"name": "send_notification", "arguments": NOTIFY}]},
                {"content": "Release notes updated and the team notified."},
            ],
        },
    }
)

AUDIT_FAILED = with_usage(
    {
        "prompt": "Notify on-call that the nightly job failed.",
        "tools": ["send_notification"],
        "provider": {
            "kind": "scripted",
            "turns": [
                {
                    "tool_calls": [
                        {
                            "name": "send_notification",
                            "arguments": {
                                "recipient": "oncall@example.org",
                                "message": "Nightly failed.",
                            },
                        }
                    ]
                },
                {"content": "On-call notified."},
            ],
        },
    }
)

NOT_RETRYABLE = with_usage(
    {
        "prompt": "Summarise the incident notes.",
        "tools": ["search_notes"],
        "provider": {
            "kind": "scripted",
            "turns": [
                {"tool_calls": [{"name": "search_notes", "arguments": {"query": "incident"}}]},
                {"error": "auth"},
            ],
        },
    }
)

RESUMED = with_usage(
    {
        "prompt": "Tell the team the deploy is done, then confirm.",
        "tools": ["send_notification"],
        # Whatever NRLLM_APPROVAL_REQUIRED_FOR says, so that its attempts are
        # counted the same: the first parks for the notification's approval.
        "require_approval": ["send_notification"],
        "provider": {
            "kind": "scripted",
            "turns": [
                {"tool_calls": [{"name": "send_notification", "arguments": NOTIFY}]},
                # The second attempt (approved) sends it and the provider fails
                # (on attempts up to the second): the retry, the third, resumes
                # from the journal and does not send it again.
                {"error": "server_error", "attempts": 2},
                {"content": "The team knows."},
            ],
        },
    }
)

CANCELLED = with_usage(
    {
        "prompt": "Post the weekly digest to the webhook.",
        "tools": ["post_webhook"],
        "provider": {"kind": "scripted", "turns": [{"content": "Never started."}]},
    }
)


WAITING = notifying(
    "Tell on-call the database failover starts at 22:00 UTC.",
    {"recipient": "oncall@example.org", "message": "Database failover starts at 22:00 UTC."},
    "On-call knows the failover starts at 22:00 UTC.",
)

APPROVED = notifying(
    "Tell the team incident 42 is resolved.",
    {"recipient": "team@example.org", "message": "Incident 42 (disk full on db-2) is resolved."},
    "The team knows incident 42 is resolved.",
    read={"slug": "incident-42"},
)

DENIED = notifying(
    "Announce the v2 release to every customer.",
    {"recipient": "customers@example.org", "message": "v2 is out: leases and fences."},
    "I did not announce v2: an operator denied the notification.",
)

#: Stops before its third model call: two turns spent 1,170 tokens, and the
#: next, which sends the whole conversation again and may be answered in up
#: to 256 tokens, could pass 1,600.
OVER_BUDGET = with_usage(
    {
        "prompt": "Search every incident note and summarise them all.",
        "tools": ["search_notes"],
        "max_total_tokens": 1600,
        "provider": {
            "kind": "scripted",
            "max_tokens": 256,
            "turns": [
                {"tool_calls": [{"name": "search_notes", "arguments": {"query": "incident"}}]},
                {"tool_calls": [{"name": "search_notes", "arguments": {"query": "outage"}}]},
                {"tool_calls": [{"name": "search_notes", "arguments": {"query": "postmortem"}}]},
                {"content": "Every incident, summarised."},
            ],
        },
    }
)

#: Support's agent: it reads the incident notes and answers, nothing more.
TRIAGE = with_usage(
    {
        "prompt": "What do we know about incident 42?",
        "tools": ["read_note", "search_notes"],
        "provider": {
            "kind": "scripted",
            "turns": [
                {"tool_calls": [{"name": "read_note", "arguments": {"slug": "incident-42"}}]},
                {"content": "Incident 42: disk full on db-2; resolved."},
            ],
        },
    }
)

#: The demo's agents (G18): each one's definition is a scenario's request
#: less its prompt, which each run gives as its input.
AGENTS = {
    "release-notes": (
        "Keeps the release notes and tells the team.",
        "You maintain the release notes. Read them before you change them, and tell "
        "the team after every change.",
        COMPLETED,
    ),
    "on-call": (
        "Tells on-call what they need to know.",
        "You are the on-call assistant. Tell on-call about planned work; never restart "
        "production yourself.",
        WAITING,
    ),
    "triage": (
        "Support's: answers what the incident notes say.",
        "You answer questions about incidents from the incident notes only.",
        TRIAGE,
    ),
}
#: The change the demo makes to ``on-call`` after its run waits: version 2.
ON_CALL_V2 = (
    "You are the on-call assistant. Tell on-call about planned work, with its start "
    "time in UTC; never restart production yourself."
)

APPROVED_NOTE = "Checked the recipient and the text."
DENIED_NOTE = "Not yet: marketing announces v2 on Monday."
#: The note on the approvals of the stories that are not about approval.
ROUTINE_NOTE = "Demo: approved so the run ends as its story says."


def demo_approver(team):
    """The ``DEMO_APPROVER`` user, created on first use as an approver and
    a runner of ``team`` (an approver releases only writes they could make,
    G22), with nothing else and an unusable password."""
    users = get_user_model().objects
    approver = users.filter(username=DEMO_APPROVER).first()
    if approver is None:
        approver = users.create_user(DEMO_APPROVER)  # no password: unusable
    for role in (Role.APPROVER, Role.RUNNER):
        Membership.objects.get_or_create(user=approver, team=team, role=role)
    # Fetched again: a user caches its roles on first use.
    return users.get(pk=approver.pk)


def demo_teams() -> tuple[Team, Team]:
    """Operations (the default team, renamed) and Support, with their
    members (``DEMO_MEMBERS``)."""
    ops = Team.objects.get(pk=DEFAULT_TEAM_ID)
    ops.name, ops.slug = "Operations", "ops"
    ops.save(update_fields=["name", "slug"])
    support, _ = Team.objects.get_or_create(
        slug="support",
        defaults={"name": "Support", "tools": ["read_note", "search_notes"]},
    )
    group, _ = Group.objects.get_or_create(name=DEMO_MEMBERS_GROUP)
    users = get_user_model().objects
    for username, slug, roles in DEMO_MEMBERS:
        member = users.filter(username=username).first()
        if member is None:
            member = users.create_user(username, is_staff=True)  # password: ensure_admin's
            member.groups.add(group)
        team = ops if slug == "ops" else support
        for role in roles or Role.values:
            Membership.objects.get_or_create(user=member, team=team, role=role)
    return ops, support


#: What Alertmanager POSTs (its webhook_config's body), shortened.
DEMO_ALERT = {
    "version": "4",
    "groupKey": '{}:{alertname="DiskFull"}',
    "status": "firing",
    "receiver": "nrllm-triage",
    "groupLabels": {"alertname": "DiskFull"},
    "commonLabels": {"alertname": "DiskFull", "instance": "db-2", "severity": "page"},
    "commonAnnotations": {"summary": "Disk full on db-2"},
    "externalURL": "http://alertmanager.example.org",
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "DiskFull", "instance": "db-2"},
            "annotations": {"summary": "Disk full on db-2"},
            "startsAt": "2026-12-01T06:58:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": "5f0c1e9d2a4b7c31",
        }
    ],
}


def demo_triggers(sam) -> tuple[list, object]:
    """Support's schedule, backfilled over two days, and its trigger, sent
    the demo alert twice; the backfilled runs and the alert's run."""
    triage = Agent.objects.get(name="triage")
    schedule = Schedule(
        agent=triage,
        name="morning-digest",
        cron="0 7 * * *",
        time_zone="Europe/Berlin",
        input_template="What happened before ${scheduled_date}? Summarise the incident notes.",
        overlap="skip",
        owner=sam,
    )
    schedule.full_clean()
    schedule.save()
    now = timezone.now()
    backfilled = schedule_actions.backfill(schedule, now - timedelta(days=2), now, sam)
    if not backfilled.ok:
        raise CommandError(f"demo backfill: {backfilled.detail}")
    trigger = EventTrigger(
        agent=triage,
        name="alertmanager",
        event_id_header="",
        event_id_template="${groupKey}/${alerts.0.startsAt}",
        input_template=(
            "Alert ${commonLabels.alertname} (${status}) on ${commonLabels.instance}: "
            "${commonAnnotations.summary}. What do the incident notes say?"
        ),
        owner=sam,
    )
    trigger.full_clean()
    trigger.save()
    body = json.dumps(DEMO_ALERT).encode()
    started = None
    for delivery in ("msg_demo_1", "msg_demo_2"):  # the same alert, sent again
        signed_at = timezone.now()
        answer = receive(
            trigger.path,
            {
                "webhook-id": delivery,
                "webhook-timestamp": str(int(signed_at.timestamp())),
                "webhook-signature": Webhook(trigger.secret).sign(delivery, signed_at, body),
            },
            body,
        )
        if answer.status not in (200, 202):
            raise CommandError(f"demo alert: {answer.status} {answer.body}")
        started = started or answer.body["run"]
    runs = AgentRun.objects.filter(firing__schedule=schedule).order_by("firing__slot")
    return list(runs), AgentRun.objects.get(pk=started)


def _pending(agent_run) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING)
        .order_by("position")
        .first()
    )


def _decide(agent_run, approver, *, approved: bool, note: str) -> None:
    """Decide the call ``agent_run`` waits for, through the operators'
    path; refused, the demo cannot tell its story, and says why."""
    approval = _pending(agent_run)
    if approval is None:
        raise CommandError(f"demo run {agent_run.pk} is {agent_run.status}: no call waits")
    decide = approval_actions.approve if approved else approval_actions.deny
    result = decide(approval, approver, digest=approval.digest, note=note)
    if not result.ok:
        raise CommandError(
            f"demo run {agent_run.pk}: {approval.tool_name} not decided ({result.code}): "
            f"{result.detail}"
        )


def _approve_every_write(agent_run, approver) -> None:
    """Approve each call ``agent_run`` waits for until it waits no more:
    each approval executes it on (inline, no Redis) until it ends or asks
    again. Under NRLLM_APPROVAL_REQUIRED_FOR=none nothing waits (but what
    a request asks for); under ``write`` its idempotent writes wait too."""
    while _pending(agent_run) is not None:
        _decide(agent_run, approver, approved=True, note=ROUTINE_NOTE)


class Command(BaseCommand):
    help = (
        "Seed demo runs by executing real scenarios (once; skipped if runs exist). "
        "Prints a line per run; -v 2 prints the runtime's log as well."
    )

    def handle(self, *args, **options):
        if AgentRun.objects.exists():
            self.stdout.write("runs exist; demo data not seeded again")
            return
        with executing_in_caller(), told_by_the_summary(options["verbosity"]):
            self._seed()

    def _seed(self):
        Note.objects.get_or_create(slug="release-notes", defaults={"body": "v1: first release."})
        Note.objects.get_or_create(slug="incident-42", defaults={"body": "Disk full on db-2."})
        ops, support = demo_teams()
        approver = demo_approver(ops)
        ModelPrice.objects.get_or_create(provider="scripted", model="scripted", defaults=DEMO_PRICE)

        for name, (description, instructions, scenario) in AGENTS.items():
            definition = {k: v for k, v in scenario.items() if k != "prompt"}
            save_agent(
                name,
                {**definition, "instructions": instructions},
                description=description,
                create=True,
                team=support if name == "triage" else ops,
            )
        sam = get_user_model().objects.get(username="sam")
        triaged = run({"agent": "triage", "input": TRIAGE["prompt"]}, submitted_by=sam)
        scheduled, alerted = demo_triggers(sam)

        completed = run({"agent": "release-notes", "input": COMPLETED["prompt"]})
        _approve_every_write(completed, approver)
        # The write executes (once approved) and the database refuses its
        # step: the run must fail closed, and is dead-lettered as a write in
        # doubt (queued, as every run is once approved, whatever the policy).
        # Only the tool's step is refused: the approval's, which names the
        # tool too, is recorded.
        with step_inserts_refused("send_notification", kind=StepKind.TOOL):
            audit_failed = enqueue({**AUDIT_FAILED, "team": "ops"})
            _approve_every_write(audit_failed, approver)
        dead_lettered = enqueue({**NOT_RETRYABLE, "team": "ops"})
        # Its retry waits its backoff (NRLLM_RETRY_BACKOFF_SECONDS): the
        # embedded worker that `make run` starts next, or an rqworker, runs it.
        resumed = enqueue({**RESUMED, "team": "ops"})
        _approve_every_write(resumed, approver)
        # Cancelled before any worker could claim it: its job finds nothing to do.
        with transaction.atomic():
            cancelled = enqueue({**CANCELLED, "team": "ops"})
            transitions.cancel(cancelled.pk)
        approved = enqueue({**APPROVED, "team": "ops"})
        _decide(approved, approver, approved=True, note=APPROVED_NOTE)
        denied = enqueue({**DENIED, "team": "ops"})
        _decide(denied, approver, approved=False, note=DENIED_NOTE)
        # Left for the operator: the admin's approvals inbox shows it until
        # it expires (NRLLM_APPROVAL_TIMEOUT_SECONDS), when the reaper ends
        # the run failed, approval_expired.
        waiting = enqueue({"agent": "on-call", "input": WAITING["prompt"]})
        on_call = AGENTS["on-call"][2]
        definition = {k: v for k, v in on_call.items() if k != "prompt"}
        save_agent("on-call", {**definition, "instructions": ON_CALL_V2}, create=False)
        over_budget = enqueue({**OVER_BUDGET, "team": "ops"})
        # People in the loop (G24): a question left for an answer, and a
        # call the demo approver edited, left for a second approval.
        asking = enqueue({**ASKING, "team": "ops"})
        edited = enqueue({**EDITED, "team": "ops"})
        edit_as_the_demo_approver(edited, approver)

        for label, agent_run in [
            ("completed (reads and writes)", completed),
            (
                "write audit failed (an injected fault): dead-lettered, a write in doubt",
                audit_failed,
            ),
            ("dead-lettered, not retryable", dead_lettered),
            ("retried: resumes after its write, does not repeat it", resumed),
            ("cancelled", cancelled),
            ("approved: sent its notification once", approved),
            ("denied: never sent; the model was told why", denied),
            ("waits for approval: decide it in the admin's approvals inbox", waiting),
            ("stopped before a model call that would pass its token limit", over_budget),
            ("asks a person: answer it in the admin's inbox", asking),
            ("edited by the demo approver: the edit waits for its own approval", edited),
            ("Support's own: completed (reads only; see it as sam or pat)", triaged),
            *[("Support's schedule morning-digest, backfilled", each) for each in scheduled],
            ("Support's trigger alertmanager: one run for an alert sent twice", alerted),
        ]:
            agent_run.refresh_from_db()
            self.stdout.write(f"{agent_run.pk}  {agent_run.status:<20} {label}")
        expires_at = _pending(waiting).expires_at
        self.stdout.write(
            f"the demo's decisions were made as the user {DEMO_APPROVER} "
            "(approver and runner in Operations only; no password: nobody logs in as it); "
            f"the waiting call expires at {expires_at:%Y-%m-%d %H:%M} UTC"
        )
