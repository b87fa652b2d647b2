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
        "SIGINT or SIGTERM: finish the run in hand and exit; a second one: exit at once."
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
        """The first SIGINT or SIGTERM lets the run in hand finish (a run cut
        short stays ``running`` until its lease expires); the second is the
        default action, at once. A SIGINT ignored when the process started
        stays ignored: a shell starts background jobs that way, so ``make
        run``'s Ctrl-C stops the web server and leaves stopping this worker
        to the recipe's trap."""
        catching = [signal.SIGTERM]
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            catching.append(signal.SIGINT)

        def first_signal(signum, frame):
            stop.set()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if signal.SIGINT in catching:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self.stderr.write(
                f"embedded worker: {signal.Signals(signum).name}: stopping after the run in hand"
            )

        for signum in catching:
            signal.signal(signum, first_signal)
