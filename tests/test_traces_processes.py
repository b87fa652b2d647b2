"""OpenTelemetry traces across processes (docs/observability.md#traces): the
standard ``OTEL_*`` variables turn them on, a bad value stops start-up
naming it (never a header's value), a process with traces off imports
nothing of the SDK, a forked work horse and a worker of ``rqworker-pool``
export their spans before they exit, and a collector that does not answer
holds a process's exit no longer than ``NRLLM_TRACES_EXIT_SECONDS``.

Real processes: ``python -c`` after ``django.setup()``, ``manage.py check``
and real ``rqworker`` and ``rqworker-pool`` whose spans go over OTLP/HTTP
to a receiver here."""

import json
import os
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ground.tracing import exporters_from_env
from runs.models import AgentRun
from runs.runtime import enqueue
from tests.helpers import ROOT, answer, call, scripted, serve_in_a_thread

#: Traces on, over OTLP.
ON = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
#: A collector's credential, in a header the SDK would log whole.
SECRET = "s3cr3t-collector-token"


@pytest.fixture
def otel_env(monkeypatch):
    """Sets ``OTEL_*`` variables for this test, none set before."""
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        monkeypatch.delenv(name)

    def set_env(**variables):
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return exporters_from_env()

    return set_env


@pytest.mark.parametrize(
    ("variables", "exporters"),
    [
        ({}, ()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c.example/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ()),
        # Disabled wins over what it would otherwise refuse.
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "zipkin"}, ()),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            ("otlp",),
        ),
        # Names in any case, once each.
        ({"OTEL_TRACES_EXPORTER": "OTLP,otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "none,None", **ON}, ()),
        # What only OTLP reads is checked only for it.
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, ()),
        (
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ("console",),
        ),
        # The traces' own variable wins over the general one.
        (
            {
                **ON,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "HTTP/Protobuf",
                "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "GZIP",
                "OTEL_EXPORTER_OTLP_HEADERS": "Authorization: Bearer x",
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer x, x-team = ops,",
            },
            ("otlp",),
        ),
        (
            {
                **ON,
                "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
                "OTEL_BSP_MAX_QUEUE_SIZE": "100",
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
                "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
                "OTEL_TRACES_SAMPLER_ARG": "0.25",
            },
            ("otlp",),
        ),
    ],
)
def test_the_standard_variables_turn_traces_on(otel_env, variables, exporters):
    assert otel_env(**variables) == exporters


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger': jaeger not available"),
        ({"OTEL_TRACES_EXPORTER": "none,otlp"}, "OTEL_TRACES_EXPORTER='none,otlp': none not"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' must be one of ['http/protobuf']",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' must be one of",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT="),
        ({"OTEL_SDK_DISABLED": "maybe"}, "OTEL_SDK_DISABLED='maybe' is not a boolean"),
        # What the SDK would log whole (a credential with it), or drop.
        (
            {**ON, "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization: Bearer {SECRET}"},
            "OTEL_EXPORTER_OTLP_HEADERS: item 1 (comma-separated) is no name=value header",
        ),
        (
            {**ON, "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f'x-team=ops,authorization="{SECRET}"'},
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS: item 2 (comma-separated)",
        ),
        # What the SDK would only warn of, and replace with its default.
        ({**ON, "OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, "OTEL_EXPORTER_OTLP_TIMEOUT='0' must be"),
        ({**ON, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="),
        ({**ON, "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION='zstd'"),
        ({**ON, "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes' must be"),
        (
            {**ON, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "nan"},
            "OTEL_TRACES_SAMPLER_ARG='nan' must be a number from 0 to 1",
        ),
        # The batching, whatever the exporter: the SDK would log and go on,
        # or stop start-up with a bare ValueError.
        (
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "soon"},
            "OTEL_BSP_SCHEDULE_DELAY='soon' is not an integer",
        ),
        ({**ON, "OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE='0' must be at least 1"),
        (
            {**ON, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"},
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=4096 must be at most OTEL_BSP_MAX_QUEUE_SIZE (2048)",
        ),
    ],
)
def test_a_value_traces_cannot_honour_is_refused_naming_the_variable(otel_env, variables, message):
    with pytest.raises(ImproperlyConfigured) as refused:
        otel_env(**variables)
    assert message in str(refused.value)
    assert SECRET not in str(refused.value)


def test_a_bad_value_stops_start_up_and_a_header_is_never_shown():
    env = {
        "PATH": "/usr/bin:/bin",
        "SECRET_KEY": "x",
        **ON,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization: Bearer {SECRET}",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: OTEL_EXPORTER_OTLP_HEADERS: item 1" in result.stderr
    assert SECRET not in result.stdout + result.stderr


#: A run from start to settle in a process of its own, two requests, and the
#: modules of the SDK, its exporters and instrumentations that loaded
#: meanwhile (the workers' and the runtime's modules loaded too). Less
#: those ``import redis`` loads by itself: redis-py imports the SDK's
#: metrics whenever it is installed, to offer metrics of its own.
A_RUN = """
import json, sys
SDK = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.instrumentation")
import redis
redis_own = {name for name in sys.modules if name.startswith(SDK)}
import django
django.setup()
import nrllm_ops.urls, runs.worker, runs.workers.embedded
from runs.runtime import run
from tests.helpers import answer, call, scripted
agent_run = run(scripted(call("search_notes", query="x"), answer(), tools=["search_notes"]))
from django.test import Client
for path in ("/healthz", "/api/runs/"):
    Client(HTTP_HOST="localhost").get(path)
loaded = sorted(name for name in sys.modules if name.startswith(SDK) and name not in redis_own)
print("RESULT", json.dumps({"status": agent_run.status, "sdk": loaded}))
"""


def run_in_a_process(env: dict) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", A_RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), done.stdout


@pytest.mark.django_db(transaction=True)
def test_with_traces_off_a_process_imports_nothing_of_the_sdk(worker_env):
    """Nor any exporter or instrumentation. The same process with traces on
    (the console exporter) is the control: the check sees what it loads, and
    it traces the run and a request, not the probe."""
    env = {name: value for name, value in worker_env.items() if not name.startswith("OTEL_")}

    off, output = run_in_a_process(env)

    assert off == {"status": "completed", "sdk": []}
    assert '"name": "nrllm.attempt"' not in output
    on, output = run_in_a_process({**env, "OTEL_TRACES_EXPORTER": "console"})
    assert on["status"] == "completed"
    assert "opentelemetry.sdk.trace" in on["sdk"]
    for name in ("nrllm.attempt", "chat", "execute_tool search_notes", "GET api/runs/"):
        assert f'"name": "{name}"' in output
    assert '"name": "GET healthz"' not in output  # a probe: no span


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's traces endpoint: keeps what it is sent."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, ExportTraceServiceRequest.FromString(body)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.received = []
    serve_in_a_thread(server)
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("command", "worker_class"),
    [
        ("rqworker", "runs.worker.Worker"),
        ("rqworker", "runs.worker.ConcurrentWorker"),
        ("rqworker-pool", "runs.worker.ConcurrentWorker"),
    ],
)
def test_a_worker_exports_its_spans_before_it_exits_a_forked_horse_included(
    workers, queue, worker_env, collector, command, worker_class
):
    """The forking worker's horse leaves by ``os._exit``, past exit hooks:
    it flushes after its job. The concurrent worker's runs are threads of
    the worker, which flushes as it exits: in its teardown, since a worker
    of ``rqworker-pool`` leaves by ``os._exit`` too (as a SimpleWorker
    does, whose teardown does the same)."""
    agent_run = enqueue(scripted(call("search_notes", query="x"), answer(), tools=["search_notes"]))
    traced = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}",
        # The batch thread would send them in a minute: the process exits long before.
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }

    if command == "rqworker":
        workers.run_burst(NRLLM_WORKER_CLASS=worker_class, **traced)
    else:
        pool = subprocess.run(
            [sys.executable, "manage.py", command, django_settings.NRLLM_QUEUE_NAME]
            + ["--num-workers", "1", "--burst", "--worker-class", worker_class],
            cwd=ROOT,
            env={**worker_env, "NRLLM_TOOLS": ",".join(django_settings.NRLLM_TOOLS), **traced},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pool.returncode == 0, pool.stderr

    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    assert {path for path, _ in collector.received} == {"/v1/traces"}
    spans = [
        (resource.resource, span)
        for _, request in collector.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert sorted(span.name for _, span in spans) == [
        "chat",
        "chat",
        "execute_tool search_notes",
        "nrllm.attempt",
    ]
    for resource, _ in spans:
        service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
        assert service == "nrllm-ops"


#: A span, then the process exits normally: when it began to.
A_SPAN_THEN_EXIT = """
import time, django
django.setup()
from ground import tracing
tracing.tracer.start_span("a span").end()
print("EXITING", time.monotonic(), flush=True)
"""


def test_a_collector_that_does_not_answer_holds_an_exit_no_longer_than_its_bound():
    """The SDK's own exit hook would wait for its exporter's timeout (10 s,
    retries included) and up to 30 s with more spans queued."""
    with socket.socket() as collector:
        # Connections are taken (the kernel's backlog), never answered.
        collector.bind(("127.0.0.1", 0))
        collector.listen(8)
        env = {
            "PATH": os.environ["PATH"],
            "SECRET_KEY": "x",
            "DJANGO_SETTINGS_MODULE": "nrllm_ops.settings",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.getsockname()[1]}",
            "NRLLM_TRACES_EXIT_SECONDS": "1",
        }
        done = subprocess.run(
            [sys.executable, "-c", A_SPAN_THEN_EXIT],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        exited = time.monotonic()
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("EXITING ")]
    waited = exited - float(line.split()[1])
    assert 1 <= waited < 4, f"the exit waited {waited:.1f} s"
    assert "the collector did not take the last spans" in done.stderr


#: An exporter of the process's own, then a fork: which processes built one.
A_FORK = """
import os
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ground.otel_sdk import PerProcessExporter
built = []
def build():
    built.append(os.getpid())
    return InMemorySpanExporter()
exporter = PerProcessExporter(build)
exporter.export([])
child = os.fork()
if child == 0:
    exporter.export([])
    exporter.export([])
    print("child", os.getpid(), *built, flush=True)
    os._exit(0)
os.waitpid(child, 0)
exporter.export([])
print("parent", os.getpid(), *built, flush=True)
"""


def test_a_forked_child_exports_through_an_exporter_of_its_own():
    done = subprocess.run(
        [sys.executable, "-c", A_FORK], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    lines = {
        line.split()[0]: [int(pid) for pid in line.split()[1:]] for line in done.stdout.splitlines()
    }
    parent, child = lines["parent"][0], lines["child"][0]
    # Built once in each process, at its start and at the child's first export.
    assert lines["parent"][1:] == [parent]
    assert lines["child"][1:] == [parent, child]
