"""``manage.py embedded_worker``: the embedded default's worker and reaper (no Redis)."""

import signal
import sys
import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from runs.workers.embedded import serve
from runs.workers.open_files import hold_open_files
from runs.workers.run_threads import RunThreads, set_the_gil_switch_interval


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
        "pass, then the queued runs that are due (delayed retries included), oldest first, "
        "up to NRLLM_WORKER_CONCURRENCY in flight at once. SIGINT or SIGTERM: claim no more, "
        "give the runs in flight NRLLM_WORKER_DRAIN_SECONDS, hand the rest back to the "
        "reaper, exit; a second SIGINT: hand them back at once."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--interval",
            type=_positive(float),
            default=1.0,
            metavar="SECONDS",
            help="seconds between passes when nothing is due (default 1)",
        )

    def handle(self, *args, interval, **options):
        if settings.REDIS_URL:
            raise CommandError(
                "REDIS_URL is set: runs are dispatched to Redis. Run `manage.py rqworker "
                "--with-scheduler` and `manage.py rqcron runs.cron` instead."
            )
        try:
            hold_open_files(settings.NRLLM_WORKER_CONCURRENCY)
        except ImproperlyConfigured as error:
            raise CommandError(f"embedded_worker not started: {error}") from None
        stop = threading.Event()
        self._stop_on_signals(stop)
        set_the_gil_switch_interval()
        runs = RunThreads(settings.NRLLM_WORKER_CONCURRENCY)
        self.stdout.write(
            f"embedded worker: reaper and due runs every {interval:g}s "
            f"(up to {runs.limit} runs in flight, the GIL's switch interval "
            f"{sys.getswitchinterval() * 1000:g} ms); SIGINT/SIGTERM to stop"
        )
        self.stdout.flush()
        try:
            serve(interval=interval, runs=runs, stop=stop)
        except KeyboardInterrupt:
            runs.drain(0)  # a second Ctrl-C mid-pass: hand them back at once
            raise
        runs.drain(settings.NRLLM_WORKER_DRAIN_SECONDS)
        self.stdout.write("embedded worker: stopped")

    def _stop_on_signals(self, stop: threading.Event) -> None:
        """SIGTERM or SIGINT: no run is claimed after it, the runs in flight
        get the drain's grace, the rest are handed back, and the worker
        exits. A second SIGINT (Ctrl-C again) hands them back at once: each
        stays ``running``, its lease lapsed, for the reaper to requeue. A
        second SIGTERM changes nothing: a group kill (``timeout``, a
        supervisor) and ``make run``'s trap each send one. A SIGINT ignored
        when the process started stays ignored: a shell starts background
        jobs so, which leaves stopping this worker under ``make run`` to the
        recipe's trap."""
        catch_sigint = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN

        def stop_claiming(signum, frame):
            if not stop.is_set():
                self.stderr.write(
                    f"embedded worker: {signal.Signals(signum).name}: "
                    "claiming no more runs; draining those in flight"
                )
            stop.set()
            if catch_sigint:
                signal.signal(signal.SIGINT, signal.default_int_handler)

        signal.signal(signal.SIGTERM, stop_claiming)
        if catch_sigint:
            signal.signal(signal.SIGINT, stop_claiming)
