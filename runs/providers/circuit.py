"""The circuit breaker in front of a provider endpoint and model (one row per
pair in ``ProviderCircuit``, shared by every worker process).

After ``NRLLM_CIRCUIT_FAILURES`` server-side failures (``connection``,
``server_error``, ``rate_limit``) within ``NRLLM_CIRCUIT_WINDOW_SECONDS`` the
circuit opens: calls fail fast with ``circuit_open`` (retryable) without
touching the provider. After ``NRLLM_CIRCUIT_COOLDOWN_SECONDS`` one trial call
is let through; its outcome closes or reopens the circuit. Every change is a
guarded UPDATE, so concurrent workers agree, and is logged as a transition.
"""

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Now

from runs.models import CircuitTransition, ProviderCircuit
from runs.models.vocabulary import FailureClass
from runs.providers.base import ProviderError
from runs.transitions import db_time

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
SERVER_SIDE = {FailureClass.CONNECTION, FailureClass.SERVER_ERROR, FailureClass.RATE_LIMIT}


def _circuit(key: str) -> ProviderCircuit:
    circuit, _ = ProviderCircuit.objects.get_or_create(key=key)
    return circuit


def _state(key: str) -> str:
    """The circuit's state, read on every call: every worker shares it. One
    column by its unique index, without the ORM: this is every model
    call's statement, and the model query and instance cost a run more CPU
    than its step records. The row is made on first use."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote('state')} FROM {quote(ProviderCircuit._meta.db_table)} "
            f"WHERE {quote('key')} = %s",
            [key],
        )
        row = cursor.fetchone()
    return row[0] if row is not None else _circuit(key).state


def _move(key: str, guard: Q, to_state: str, reason: str, **changes) -> bool:
    """One guarded state change, logged as a transition when it matched."""
    with transaction.atomic():
        circuit = ProviderCircuit.objects.filter(key=key).filter(guard)
        before = circuit.values_list("state", flat=True).first()
        if before is None or not circuit.update(state=to_state, **changes):
            return False
        CircuitTransition.objects.create(
            circuit=ProviderCircuit.objects.get(key=key),
            from_state=before,
            to_state=to_state,
            reason=reason,
        )
    return True


def before_call(key: str) -> bool:
    """Let the call through, or raise ``circuit_open`` without touching the
    provider. Returns whether the call is the circuit's trial: only a trial's
    success closes it (``record_success``), so a call let through closed
    costs no statement after it."""
    if _state(key) == CLOSED:
        return False
    cooldown = settings.NRLLM_CIRCUIT_COOLDOWN_SECONDS
    cooled = db_time(-cooldown)
    # A trial that never reported (its worker died) is given up after the
    # read timeout, so the circuit cannot stay half-open for ever.
    stale_trial = db_time(-(settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS + cooldown))
    if _move(
        key,
        Q(state=OPEN, opened_at__lte=cooled)
        | Q(state=HALF_OPEN, trial_started_at__lte=stale_trial),
        HALF_OPEN,
        "cool-down over: one trial call",
        trial_started_at=Now(),
    ):
        return True
    raise ProviderError(
        f"circuit open for {key}: failing fast without calling the provider",
        failure_class=FailureClass.CIRCUIT_OPEN,
        retry_after=cooldown,
    )


def record_success(key: str) -> None:
    """The trial call succeeded: close the circuit (if it is not closed)."""
    if ProviderCircuit.objects.filter(key=key).exclude(state=CLOSED).exists():
        _move(
            key,
            ~Q(state=CLOSED),
            CLOSED,
            "trial call succeeded",
            failures=0,
            window_started_at=None,
            opened_at=None,
            trial_started_at=None,
        )


def record_failure(key: str, failure_class: str) -> None:
    """Count a server-side failure; open the circuit at the threshold."""
    if failure_class not in SERVER_SIDE:
        return
    if _move(
        key,
        Q(state=HALF_OPEN),
        OPEN,
        f"trial call failed ({failure_class})",
        opened_at=Now(),
        trial_started_at=None,
    ):
        return
    window_start = db_time(-settings.NRLLM_CIRCUIT_WINDOW_SECONDS)
    # Count within the window; a failure after the window starts a new one.
    ProviderCircuit.objects.filter(key=key, state=CLOSED).update(
        failures=Case(
            When(window_started_at__gte=window_start, then=F("failures") + 1), default=Value(1)
        ),
        window_started_at=Case(
            When(window_started_at__gte=window_start, then=F("window_started_at")),
            default=Now(),
        ),
    )
    _move(
        key,
        Q(state=CLOSED, failures__gte=settings.NRLLM_CIRCUIT_FAILURES),
        OPEN,
        f"{settings.NRLLM_CIRCUIT_FAILURES} server-side failures within "
        f"{settings.NRLLM_CIRCUIT_WINDOW_SECONDS}s (last: {failure_class})",
        opened_at=Now(),
    )


def cooldown_left(circuit: ProviderCircuit, now) -> float:
    if circuit.state != OPEN or circuit.opened_at is None:
        return 0
    left = circuit.opened_at + timedelta(seconds=settings.NRLLM_CIRCUIT_COOLDOWN_SECONDS) - now
    return max(0.0, left.total_seconds())
