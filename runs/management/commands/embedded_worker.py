"""``manage.py embedded_worker``: the embedded default's worker and reaper (no Redis)."""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs.embedded_worker import serve


def _positive(kind):
    def parse(value: str):
        number = kind(value)
        if number <= 0:
            raise ValueError(value)
        return number

    parse.__name__ = f"positive {kind.__name__}"
    return parse


class Command(BaseCommand):
    help = (
        "The embedded default's worker (no Redis): every --interval seconds one reaper "
        "pass, then the queued runs that are due (delayed retries included), oldest first. "
        "SIGINT or SIGTERM: finish the run in hand and exit; a second SIGINT: at once."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--interval",
            type=_positive(float),
            default=1.0,
            metavar="SECONDS",
            help="seconds between passes when nothing is due (default 1)",
        )
        parser.add_argument(
            "--batch-size",
            type=_positive(int),
            default=10,
            metavar="RUNS",
            help="due runs executed per pass before the reaper's next pass (default 10)",
        )

    def handle(self, *args, interval, batch_size, **options):
        if settings.REDIS_URL:
            raise CommandError(
                "REDIS_URL is set: runs are dispatched to Redis. Run `manage.py rqworker "
                "--with-scheduler` and `manage.py rqcron runs.cron` instead."
            )
        stop = threading.Event()
        self._stop_on_signals(stop)
        self.stdout.write(
            f"embedded worker: reaper and due runs every {interval:g}s "
            f"(up to {batch_size} runs a pass); SIGINT/SIGTERM to stop"
        )
        self.stdout.flush()
        serve(interval=interval, batch_size=batch_size, stop=stop)
        self.stdout.write("embedded worker: stopped")

    def _stop_on_signals(self, stop: threading.Event) -> None:
        """SIGTERM or SIGINT lets the run in hand finish, then the worker
        exits. A second SIGINT (Ctrl-C again) stops it at once: the run cut
        short stays ``running`` until its lease expires and the reaper
        requeues it. A second SIGTERM changes nothing: a group kill
        (``timeout``, a supervisor) and ``make run``'s trap each send one.
        A SIGINT ignored when the process started stays ignored: a shell
        starts background jobs so, which leaves stopping this worker under
        ``make run`` to the recipe's trap."""
        catch_sigint = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN

        def stop_after_the_run_in_hand(signum, frame):
            if not stop.is_set():
                self.stderr.write(
                    f"embedded worker: {signal.Signals(signum).name}: "
                    "stopping after the run in hand"
                )
            stop.set()
            if catch_sigint:
                signal.signal(signal.SIGINT, signal.default_int_handler)

        signal.signal(signal.SIGTERM, stop_after_the_run_in_hand)
        if catch_sigint:
            signal.signal(signal.SIGINT, stop_after_the_run_in_hand)
