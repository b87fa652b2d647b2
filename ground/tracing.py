"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables ask
for them, and free when off (docs/observability.md#traces).

``exporters_from_env`` reads the on-switch once, when the settings load,
and refuses a value it cannot honour with ``ImproperlyConfigured`` naming
the variable: the SDK, which reads the rest itself when it starts, would
only log a bad one and go on with its default, or stop the process with a
bare ``ValueError`` (a batch larger than the queue), or log it whole (a
malformed header, a collector's credential with it). What it reads is
checked as it will read it: the ``OTEL_EXPORTER_OTLP_TRACES_*`` variable
when set, else the general one. ``start_from_settings`` (Django's start,
``RunsConfig.ready``) then sets up the process's tracer provider
(``ground.otel_sdk``, the only module that imports the SDK). The hot
path reads one name, ``tracer``: while it is None nothing of the SDK is
imported, and the runtime's span helpers (``runs.runtime.spans``) return a
shared no-op.

One provider per process, this app's own rather than the API's global: the
spans exported are the ones docs/observability.md lists, not whatever a
library makes by itself. Forks: the SDK restarts its batch thread in a
child, the OTLP exporter is built again in each process (``otel_sdk``), and
a work horse, which leaves by ``os._exit`` (no atexit), flushes before it
exits (``flush``, ``runs.worker.Worker``), as does a worker of
``rqworker-pool`` in its teardown. Any other process exports what is left
as it exits normally, waiting for the collector at most
``NRLLM_TRACES_EXIT_SECONDS``: the SDK's own hook would wait up to 30 s
for one that does not answer, holding a deploy's restart.
"""

import atexit
import logging
import math
import re
import threading

from django.core.exceptions import ImproperlyConfigured

from ground.env import env_bool, env_http_url, env_int, env_list, env_str

logger = logging.getLogger(__name__)

#: The span exporters ``OTEL_TRACES_EXPORTER`` may name (or ``none``).
EXPORTERS = ("otlp", "console")
#: The one OTLP protocol installed (opentelemetry-exporter-otlp-proto-http):
#: no gRPC, which would bring grpcio.
OTLP_PROTOCOL = "http/protobuf"
#: What the OTLP exporter can compress with.
COMPRESSIONS = ("gzip", "deflate", "none")
#: The samplers the SDK knows (``OTEL_TRACES_SAMPLER``); the ratio ones take
#: ``OTEL_TRACES_SAMPLER_ARG``.
SAMPLERS = (
    "always_on",
    "always_off",
    "parentbased_always_on",
    "parentbased_always_off",
    "traceidratio",
    "parentbased_traceidratio",
)
#: Requests not traced unless ``OTEL_PYTHON_DJANGO_EXCLUDED_URLS`` says
#: otherwise: the probes and the scrape, every few seconds, would drown the rest.
PROBES = "/healthz$,/readyz$,/metrics$"
#: A header as the SDK parses ``OTEL_EXPORTER_OTLP_HEADERS`` without logging
#: it: a name (an HTTP token), ``=``, a value of printable ASCII but
#: ``"``, ``,``, ``;`` and ``\``.
_HEADER = re.compile(
    r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+[ \t]*=[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
)

#: The tracer the runtime's spans come from; None while traces are off:
#: the one thing the hot path reads.
tracer = None
_provider = None
#: The export a bounded wait gave up on, which may still be waiting for the
#: collector (``_within``).
_given_up: threading.Thread | None = None


def exporters_from_env() -> tuple[str, ...]:
    """The exporters the environment asks spans to be sent to, () for none.

    ``OTEL_SDK_DISABLED=true`` wins. Otherwise ``OTEL_TRACES_EXPORTER``
    names them (``otlp``, ``console``, comma-separated, in any case;
    ``none``); unset, it is ``otlp`` when an OTLP endpoint is set, and
    traces are off when none is. With traces on, a value this app or the SDK
    cannot honour stops start-up naming the variable: an exporter not
    shipped, the batching (``OTEL_BSP_*``), the sampler and, for ``otlp``
    only, the endpoint, protocol, timeout, compression and headers.
    """
    if env_bool("OTEL_SDK_DISABLED", False):
        return ()
    otlp = _otlp_variables()
    named = tuple(dict.fromkeys(name.lower() for name in env_list("OTEL_TRACES_EXPORTER")))
    if not named:
        named = ("otlp",) if otlp["ENDPOINT"][1].strip() else ()
    if named == ("none",):
        return ()
    unknown = [name for name in named if name not in EXPORTERS]
    if unknown:
        raise ImproperlyConfigured(
            f"OTEL_TRACES_EXPORTER={env_str('OTEL_TRACES_EXPORTER')!r}: {', '.join(unknown)} "
            f"not available; use {' or '.join(EXPORTERS)} (comma-separated), or none alone"
        )
    _check_batching()
    _check_sampler()
    if "otlp" in named:
        _check_otlp(otlp)
    return named


def _otlp_variables() -> dict[str, tuple[str, str]]:
    """Each OTLP setting → (variable, value) as the exporter reads it: the
    traces' own variable when set, else the general one (the
    specification's order, and the SDK's)."""
    # Each by its name: docs/operations.md's table is checked against them.
    read = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": env_str("OTEL_EXPORTER_OTLP_ENDPOINT"),
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": env_str("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        "OTEL_EXPORTER_OTLP_PROTOCOL": env_str("OTEL_EXPORTER_OTLP_PROTOCOL"),
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": env_str("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
        "OTEL_EXPORTER_OTLP_TIMEOUT": env_str("OTEL_EXPORTER_OTLP_TIMEOUT"),
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": env_str("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"),
        "OTEL_EXPORTER_OTLP_COMPRESSION": env_str("OTEL_EXPORTER_OTLP_COMPRESSION"),
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": env_str("OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
        "OTEL_EXPORTER_OTLP_HEADERS": env_str("OTEL_EXPORTER_OTLP_HEADERS"),
    }
    chosen = {}
    for general in [name for name in read if "_TRACES_" not in name]:
        setting = general.removeprefix("OTEL_EXPORTER_OTLP_")
        traces = f"OTEL_EXPORTER_OTLP_TRACES_{setting}"
        chosen[setting] = (traces, read[traces]) if read[traces] else (general, read[general])
    return chosen


def _check_otlp(otlp: dict[str, tuple[str, str]]) -> None:
    env_http_url(otlp["ENDPOINT"][0])
    name, value = otlp["PROTOCOL"]
    if value.strip() and value.strip().lower() != OTLP_PROTOCOL:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of [{OTLP_PROTOCOL!r}]")
    name, value = otlp["TIMEOUT"]
    if value and not 0 < _number(value) < math.inf:
        raise ImproperlyConfigured(f"{name}={value!r} must be a number of seconds above 0")
    name, value = otlp["COMPRESSION"]
    if value and value.strip().lower() not in COMPRESSIONS:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of {list(COMPRESSIONS)}")
    name, value = otlp["HEADERS"]
    for position, item in enumerate(value.split(","), 1):
        if item.strip() and not _HEADER.fullmatch(item.strip()):
            # Never the item: it is likely a credential.
            raise ImproperlyConfigured(
                f"{name}: item {position} (comma-separated) is no name=value header: a "
                "name, '=', then a value of printable ASCII without '\"', ';' or '\\' "
                "(URL-encode the rest)"
            )


def _check_batching() -> None:
    # The defaults are the specification's, as the SDK's.
    env_int("OTEL_BSP_SCHEDULE_DELAY", 5000, minimum=1)
    env_int("OTEL_BSP_EXPORT_TIMEOUT", 30000, minimum=0)
    queue = env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048, minimum=1)
    batch = env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, minimum=1)
    if batch > queue:
        raise ImproperlyConfigured(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={batch} must be at most "
            f"OTEL_BSP_MAX_QUEUE_SIZE ({queue})"
        )


def _check_sampler() -> None:
    sampler = env_str("OTEL_TRACES_SAMPLER")
    if not sampler:
        return
    # Lowercased, not stripped: as the SDK reads it.
    if sampler.lower() not in SAMPLERS:
        raise ImproperlyConfigured(
            f"OTEL_TRACES_SAMPLER={sampler!r} must be one of {list(SAMPLERS)}"
        )
    ratio = env_str("OTEL_TRACES_SAMPLER_ARG")
    if sampler.lower().endswith("traceidratio") and ratio and not 0 <= _number(ratio) <= 1:
        raise ImproperlyConfigured(
            f"OTEL_TRACES_SAMPLER_ARG={ratio!r} must be a number from 0 to 1"
        )


def _number(text: str) -> float:
    """``text`` as the SDK reads a number (``float``), NaN if it is none."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def start_from_settings() -> None:
    """Trace this process as ``NRLLM_TRACES_EXPORTERS`` says: the runs'
    spans, and a span per web request (opentelemetry-instrumentation-django;
    ``OTEL_PYTHON_DJANGO_INSTRUMENT=False`` leaves requests out). Does
    nothing, and imports nothing, when traces are off."""
    from django.conf import settings

    if _provider is not None or not settings.NRLLM_TRACES_EXPORTERS:
        return
    from ground import otel_sdk

    start(*otel_sdk.exporters(settings.NRLLM_TRACES_EXPORTERS))
    otel_sdk.instrument_django(
        _provider, excluded_urls=env_str("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", PROBES)
    )


def start(*exporters, batch: bool = True) -> None:
    """Make spans from now on and send them to ``exporters`` (SDK span
    exporters): batched in the background, or as each span ends
    (``batch=False``). The process's exit sends what is left, waiting at
    most ``NRLLM_TRACES_EXIT_SECONDS``. Raises ``RuntimeError`` if spans
    are made already."""
    global tracer, _provider
    if _provider is not None:
        raise RuntimeError("traces are on already in this process: stop() them first")
    from ground import otel_sdk

    _provider = otel_sdk.tracer_provider(exporters, batch=batch)
    tracer = _provider.get_tracer("nrllm-ops")
    atexit.register(_at_exit)


def stop(timeout_seconds: float | None = None) -> bool:
    """Make no more spans; those ended are exported first, and the exporters
    shut down, waiting at most ``timeout_seconds`` (None: as long as they
    take). True if all went (or traces were off)."""
    global tracer, _provider
    provider = _provider
    tracer, _provider = None, None
    if provider is None:
        return True
    atexit.unregister(_at_exit)
    return _within(provider.shutdown, timeout_seconds)


def flush(timeout_seconds: float) -> bool:
    """Export every span ended and not yet sent, waiting at most
    ``timeout_seconds`` for it: True if all went (or traces are off). The
    SDK's own flush waits for its exporter's timeout and retries, 10 s by
    default for a collector that does not answer; what is left after the
    wait is dropped with its process."""
    provider = _provider
    if provider is None:
        return True
    return _within(provider.force_flush, timeout_seconds)


def _within(export, timeout_seconds: float | None) -> bool:
    """``export()``, on a thread of its own if bounded: a collector that
    does not answer holds that thread, not the caller, which goes on after
    ``timeout_seconds``. True if it ended in time."""
    global _given_up
    if timeout_seconds is None:
        export()
        return True
    exporting = threading.Thread(target=export, name="otel-export", daemon=True)
    exporting.start()
    exporting.join(timeout_seconds)
    if exporting.is_alive():
        _given_up = exporting
        return False
    return True


def _at_exit() -> None:
    """The process exits normally (the SDK's own hook is off: it waits up to
    30 s). Its spans are sent within ``NRLLM_TRACES_EXIT_SECONDS``, or not
    waited for at all if an earlier bounded wait (a worker's teardown flush)
    still waits for the collector: the exporter is that wait's until it
    ends, and the process would only wait behind it."""
    from django.conf import settings

    stuck = _given_up is not None and _given_up.is_alive()
    if not stop(timeout_seconds=0 if stuck else settings.NRLLM_TRACES_EXIT_SECONDS):
        logger.warning("traces: the collector did not take the last spans; they are dropped")
