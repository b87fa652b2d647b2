"""The OpenTelemetry SDK behind ``ground.tracing``, imported only once
traces are on: the process's tracer provider, its exporters, and the
instrumentation of Django's requests.

The provider's resource is what the SDK reads from ``OTEL_SERVICE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES``, named ``nrllm-ops`` when neither names
the service; its sampler is ``OTEL_TRACES_SAMPLER``'s, and the batching
``OTEL_BSP_*``'s, as the SDK reads them (``ground.tracing`` has
checked them at start-up).

The OTLP exporter holds a pool of HTTP connections. A forked child (RQ's
work horse, a gunicorn worker forked from a master that loaded the app)
must not send over its parent's sockets, so each process builds its own
(``PerProcessExporter``), as ``runs.providers.openai_clients`` does with its
clients; the SDK itself restarts the batch thread in the child.
"""

import os
from collections.abc import Callable, Iterable, Sequence

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

#: The service name when the environment names none.
DEFAULT_SERVICE_NAME = "nrllm-ops"


def tracer_provider(exporters: Iterable[SpanExporter], *, batch: bool) -> TracerProvider:
    """A provider sending every span to ``exporters``, batched in the
    background or (``batch=False``) as each span ends. Not shut down by the
    SDK's exit hook, which waits up to 30 s for a collector that does not
    answer: ``ground.tracing`` shuts it down, within a bound."""
    provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
    processor = BatchSpanProcessor if batch else SimpleSpanProcessor
    for exporter in exporters:
        provider.add_span_processor(processor(exporter))
    return provider


def _resource() -> Resource:
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def exporters(names: Sequence[str]) -> list[SpanExporter]:
    """The exporters ``ground.tracing.EXPORTERS`` names: ``otlp`` (over
    HTTP, configured by the ``OTEL_EXPORTER_OTLP_*`` variables as the SDK
    reads them), ``console`` (a JSON object per span on standard output)."""
    return [
        ConsoleSpanExporter() if name == "console" else PerProcessExporter(_otlp) for name in names
    ]


def _otlp() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class PerProcessExporter(SpanExporter):
    """An exporter of the calling process's own: built now (a bad
    configuration shows at start-up), and again in a forked child at its
    first export. The one a child inherited is set aside, never used or
    closed there: its connections are its parent's."""

    def __init__(self, build: Callable[[], SpanExporter]):
        self._build = build
        self._exporter = build()
        self._pid = os.getpid()
        self._inherited: list[SpanExporter] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._pid != os.getpid():
            # The batch thread exports one batch at a time: no lock needed.
            self._inherited.append(self._exporter)
            self._exporter, self._pid = self._build(), os.getpid()
        return self._exporter.export(spans)

    def shutdown(self) -> None:
        if self._pid == os.getpid():
            self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


def instrument_django(provider: TracerProvider, *, excluded_urls: str) -> None:
    """A span per request (a server span; an incoming ``traceparent`` is its
    parent), from ``provider``, except for URLs matching ``excluded_urls``
    (comma-separated patterns). A run executed in the request (with
    ``NRLLM_EXECUTE_IN_CALLER``) has its attempt's span inside it."""
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls=excluded_urls)
