"""``manage.py rqcron runs.cron``: django-rq's, with a scheduler that outlives
a Redis outage (``runs.workers.cron_scheduler``) instead of exiting on it."""

import logging

from django_rq.management.commands.rqcron import Command as RQCronCommand

from runs.workers.cron_scheduler import OutageProofCronScheduler


class Command(RQCronCommand):
    def handle(self, *args, **options):
        # django-rq's, but for the scheduler's class: it names its own.
        scheduler = OutageProofCronScheduler(
            logging_level=getattr(logging, options["logging_level"])
        )
        self.stdout.write(f"Loading cron configuration from {options['config_path']}")
        scheduler.load_config_from_file(options["config_path"])
        self.stdout.write(f"Starting cron scheduler with {len(scheduler.get_jobs())} jobs...")
        self.stdout.flush()
        scheduler.start()
