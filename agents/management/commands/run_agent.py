"""``manage.py run_agent``: execute an interactive run inline and print its end."""

import json
import signal

from django.core.management.base import BaseCommand, CommandError

from agents.management.commands._request_file import read_request
from agents.starting import run
from runs.models import AgentRun
from runs.run_webhooks import deliver_new_events_of
from runs.runtime import CallerInterrupted
from runs.runtime.run_request import InvalidRunRequest


class Command(BaseCommand):
    help = (
        "Execute an interactive run from a request JSON file (or - for stdin): a whole "
        'request, or {"agent": "<name>", "input": "..."}; prints the outcome as JSON.'
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="request JSON file, or - for stdin")

    def handle(self, *args, file, **options):
        request = read_request(file)
        # SIGTERM stops the run as Ctrl-C does: the runtime settles it
        # cancelled before the process exits, and nothing finishes it later.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            agent_run = run(request)
        except InvalidRunRequest as error:
            signal.signal(signal.SIGTERM, previous)
            raise CommandError(f"invalid run request: {error}") from None
        except CallerInterrupted as interrupted:
            # Exiting: a further signal must not turn exit status 130 into a kill.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
            status = (
                AgentRun.objects.filter(pk=interrupted.run_id)
                .values_list("status", flat=True)
                .first()
            )
            raise CommandError(
                f"interrupted: run {interrupted.run_id} is {status}", returncode=130
            ) from None
        except KeyboardInterrupt:
            raise CommandError("interrupted before the run started", returncode=130) from None
        signal.signal(signal.SIGTERM, previous)
        # Its end's webhook (G19), tried once here; retries are the reaper's.
        if agent_run.webhook_url:
            deliver_new_events_of(agent_run.pk)
        outcome = {
            "id": str(agent_run.pk),
            "status": agent_run.status,
            "termination_reason": agent_run.termination_reason,
            "failure_class": agent_run.failure_class,
            "error_type": agent_run.error_type,
            "error_message": agent_run.error_message,
            "output": agent_run.output,
            "steps": agent_run.step_count,
        }
        self.stdout.write(json.dumps(outcome, indent=2))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)
