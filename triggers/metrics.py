"""Prometheus counters of schedules and event triggers (G23): firings by
outcome, skipped slots by reason, and events by what became of them —
summed over processes by prometheus-client's multiprocess mode, as the
runtime's are (``runs.models.metrics``). No label names a schedule or a
trigger: their number is the operators', not the metrics server's."""

from prometheus_client import Counter

SCHEDULE_FIRINGS = Counter(
    "nrllm_schedule_firings_total",
    "Schedule slots by outcome: fired, buffered (buffer_one), skipped_missed (older than the "
    "catch-up window), skipped_overlap, refused (the start was refused), paused (a run of the "
    "schedule left a write in doubt or a dead letter)",
    ["outcome"],
)
TRIGGER_EVENTS = Counter(
    "nrllm_trigger_events_total",
    "Events POSTed to triggers by what became of them: started, duplicate (dropped: the same "
    "event id within the window), unauthenticated (a bad or stale signature), invalid (400), "
    "rate_limited, refused (the start was refused), disabled, not_found",
    ["outcome"],
)


def fired(schedule) -> None:
    SCHEDULE_FIRINGS.labels("fired").inc()


def skipped(schedule, reason: str, count: int = 1) -> None:
    SCHEDULE_FIRINGS.labels(f"skipped_{reason}").inc(count)


def buffered(schedule) -> None:
    SCHEDULE_FIRINGS.labels("buffered").inc()


def refused(schedule) -> None:
    SCHEDULE_FIRINGS.labels("refused").inc()


def paused(schedule) -> None:
    SCHEDULE_FIRINGS.labels("paused").inc()


def event(outcome: str) -> None:
    TRIGGER_EVENTS.labels(outcome).inc()
