"""Demo data made by executing real scenarios through the runtime."""

from django.core.management.base import BaseCommand
from django.db import transaction

from runs import transitions
from runs.faults import step_inserts_refused
from runs.models import AgentRun
from runs.runtime import enqueue, run
from tools.models import Note

NOTIFY = {"recipient": "ops@example.org", "message": "Release notes updated."}

COMPLETED = {
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
                        "arguments": {"slug": "release-notes", "body": "v2: leases and fences."},
                    }
                ]
            },
            {"tool_calls": [{"name": "send_notification", "arguments": NOTIFY}]},
            {"content": "Release notes updated and the team notified."},
        ],
    },
}

AUDIT_FAILED = {
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

NOT_RETRYABLE = {
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

RESUMED = {
    "prompt": "Tell the team the deploy is done, then confirm.",
    "tools": ["send_notification"],
    "provider": {
        "kind": "scripted",
        "turns": [
            {"tool_calls": [{"name": "send_notification", "arguments": NOTIFY}]},
            # The provider fails once after the notification went out: the
            # retry resumes from the journal and does not send it again.
            {"error": "server_error", "attempts": 1},
            {"content": "The team knows."},
        ],
    },
}

CANCELLED = {
    "prompt": "Post the weekly digest to the webhook.",
    "tools": ["post_webhook"],
    "provider": {"kind": "scripted", "turns": [{"content": "Never started."}]},
}


class Command(BaseCommand):
    help = "Seed demo runs by executing real scenarios (once; skipped if runs exist)."

    def handle(self, *args, **options):
        if AgentRun.objects.exists():
            self.stdout.write("runs exist; demo data not seeded again")
            return
        Note.objects.get_or_create(slug="release-notes", defaults={"body": "v1: first release."})
        Note.objects.get_or_create(slug="incident-42", defaults={"body": "Disk full on db-2."})

        completed = run(COMPLETED)
        # The database refuses the write's step: the run must fail closed.
        with step_inserts_refused("send_notification"):
            audit_failed = run(AUDIT_FAILED)
        dead_lettered = enqueue(NOT_RETRYABLE)
        # Its retry waits its backoff (NRLLM_RETRY_BACKOFF_SECONDS): the
        # embedded worker that `make run` starts next, or an rqworker, runs it.
        resumed = enqueue(RESUMED)
        # Cancelled before any worker could claim it: its job finds nothing to do.
        with transaction.atomic():
            cancelled = enqueue(CANCELLED)
            transitions.cancel(cancelled.pk)

        for label, agent_run in [
            ("completed (reads and writes)", completed),
            ("write audit failed", audit_failed),
            ("dead-lettered, not retryable", dead_lettered),
            ("retried: resumes after its write, does not repeat it", resumed),
            ("cancelled", cancelled),
        ]:
            agent_run.refresh_from_db()
            self.stdout.write(f"{agent_run.pk}  {agent_run.status:<10} {label}")
