"""Prometheus metrics of the runtime.

Event counters and histograms are updated where things happen; the state of
the runs table (runs by status, open dead letters, writes in doubt, circuits)
is read from the database at scrape time by ``RunStateCollector``. With
``PROMETHEUS_MULTIPROC_DIR`` set, the counters of every worker process (RQ
forks a work horse per job) are summed by prometheus-client's multiprocess mode.
"""

import time

from django.db.models import Count
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from ground import metrics_files

STEPS = Counter("nrllm_steps_total", "Steps recorded", ["kind", "effect"])
STEP_RECORD_SECONDS = Histogram(
    "nrllm_step_record_seconds", "Time to record a step (guarded UPDATE + INSERT)"
)
PROVIDER_SECONDS = Histogram(
    "nrllm_provider_call_seconds",
    "Provider call latency",
    ["kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
LEASES_LOST = Counter("nrllm_lease_renewals_lost_total", "Workers that found their lease lost")
REAPER_DECISIONS = Counter("nrllm_reaper_decisions_total", "Reaper decisions", ["decision"])
RESUMES = Counter("nrllm_resumes_total", "Attempts that resumed from the run's journal")
REPLAYED_STEPS = Counter(
    "nrllm_replayed_steps_total", "Journal steps replayed instead of done again", ["kind"]
)
AUDIT_FAILURES = Counter(
    "nrllm_audit_persistence_failures_total", "Write steps that could not be persisted", ["effect"]
)
APPROVAL_REQUESTS = Counter(
    "nrllm_approval_requests_total", "Calls that were made to wait for approval", ["tool"]
)
APPROVAL_DECISIONS = Counter(
    "nrllm_approval_decisions_total",
    "Approval requests ended: approved, denied, expired, withdrawn (run cancelled)",
    ["outcome"],
)
APPROVAL_DECISION_SECONDS = Histogram(
    "nrllm_approval_decision_seconds",
    "Time from a call's approval request to an operator's decision",
    ["outcome"],
    buckets=(10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600),
)
APPROVAL_WEBHOOKS = Counter(
    "nrllm_approval_webhooks_total",
    "Approval webhook POSTs: delivered (2xx), rejected (another status), failed "
    "(refused by the guard, or no answer)",
    ["outcome"],
)
RUN_WEBHOOKS = Counter(
    "nrllm_run_webhook_deliveries_total",
    "Run-ended webhook attempts (G19): delivered (2xx), rejected (another status), failed "
    "(refused by the guard, or no answer); gave_up: events given up after the last attempt",
    ["outcome"],
)
TOKENS = Counter(
    "nrllm_tokens_total",
    "Model tokens of recorded turns: input (cached_input: the part served from the "
    "provider's cache) and output",
    ["model", "kind"],
)
COST = Counter("nrllm_cost_total", "Cost of recorded turns of priced models", ["model"])
BUDGET_REFUSALS = Counter(
    "nrllm_budget_refusals_total",
    "Budget refusals: at enqueue (429), or before a model call (budget_exhausted)",
    ["where"],
)
RESERVATION_WAITS = Histogram(
    "nrllm_budget_reservation_wait_seconds",
    "How long a model call waited for room its submitter's calls in flight held (G21)",
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

RATE_LIMIT_WAIT_SECONDS = Histogram(
    "nrllm_rate_limit_wait_seconds",
    "Model calls that waited for a shared rate limit or a provider's pause, and how long "
    "(_count: the waits)",
    ["limit"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
RATE_LIMIT_EVENTS = Counter(
    "nrllm_rate_limit_events_total",
    "Shared rate limits: provider_429 (answers 429), gave_up (a wait past "
    "NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS), unavailable (Redis unreachable: the call went "
    "without the limit)",
    ["limit", "event"],
)


def count_spend(model: str, spend) -> None:
    """Add recorded turns' spend (a ``spend.recording.TurnsSpend``)."""
    TOKENS.labels(model, "input").inc(spend.input_tokens)
    TOKENS.labels(model, "cached_input").inc(spend.cached_input_tokens)
    TOKENS.labels(model, "output").inc(spend.output_tokens)
    COST.labels(model).inc(float(spend.cost))


# Defining them created this process's files (multiprocess mode): it folds
# them as it exits.
metrics_files.fold_at_exit()


class TimedProvider:
    """Wraps a provider to observe its call latency."""

    def __init__(self, provider, kind: str):
        self._provider = provider
        self._kind = kind

    def next_turn(self, messages, tool_specs):
        started = time.monotonic()
        try:
            return self._provider.next_turn(messages, tool_specs)
        finally:
            PROVIDER_SECONDS.labels(self._kind).observe(time.monotonic() - started)


class RunStateCollector:
    """Gauges read from the database at scrape time."""

    def collect(self):
        from runs.models import AgentRun, ApprovalRequest, DeadLetter, ProviderCircuit
        from runs.models.selectors import writes_in_doubt
        from runs.models.vocabulary import ApprovalStatus, WaitKind

        runs = GaugeMetricFamily(
            "nrllm_runs", "Runs by status and termination reason", labels=["status", "reason"]
        )
        for row in AgentRun.objects.values("status", "termination_reason").annotate(n=Count("pk")):
            runs.add_metric([row["status"], row["termination_reason"]], row["n"])
        yield runs
        yield GaugeMetricFamily(
            "nrllm_dead_letters_open",
            "Dead letters not resolved",
            value=DeadLetter.objects.filter(resolved_at__isnull=True).count(),
        )
        yield GaugeMetricFamily(
            "nrllm_writes_in_doubt",
            "Ended runs with a write in doubt not reconciled (G10: runs.models.selectors)",
            value=writes_in_doubt(AgentRun.objects.all()).count(),
        )
        pending = dict(
            ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
            .values_list("kind")
            .annotate(n=Count("pk"))
        )
        yield GaugeMetricFamily(
            "nrllm_approvals_pending",
            "Calls waiting for an operator's approval",
            value=pending.get(WaitKind.APPROVAL, 0),
        )
        waiting = GaugeMetricFamily(
            "nrllm_inputs_pending",
            "Calls waiting for a person's answer or another system's completion (G24)",
            labels=["kind"],
        )
        for kind in (WaitKind.QUESTION, WaitKind.DEFERRED):
            waiting.add_metric([kind.value], pending.get(kind, 0))
        yield waiting
        circuits = GaugeMetricFamily(
            "nrllm_circuit_open", "1 when a provider circuit is not closed", labels=["key", "state"]
        )
        for key, state in ProviderCircuit.objects.values_list("key", "state"):
            circuits.add_metric([key, state], 0 if state == "closed" else 1)
        yield circuits
