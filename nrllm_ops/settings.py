"""Settings for nrllm-ops, read only from environment variables.

Every variable is listed with its default in docs/operations.md. Defaults run locally
with zero setup: a SQLite file under ``var/`` and in-process execution.
"""

import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from django.core.management.utils import get_random_secret_key

from ground.database import database_from_url
from ground.env import (
    env_bool,
    env_choice,
    env_decimal,
    env_http_url,
    env_int,
    env_list,
    env_rate_limits,
    env_str,
)
from ground.tracing import exporters_from_env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if env_str("DATABASE_URL") and not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DATABASE_URL is set")
    # Local default only: a key kept beside the SQLite file, so sessions
    # survive restarts of `make run`.
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        VAR_DIR.mkdir(exist_ok=True)
        _key_file.write_text(get_random_secret_key())
    SECRET_KEY = _key_file.read_text().strip()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "nrllm_ops.apps.AdminConfig",  # Django's admin, on our site (console/site.py)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before django_rq: its ``rqworker`` command is runs' (a durability check first).
    "runs",
    "django_rq",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "knox",
    "teams",
    "tools",
    "spend",
    "agents",
    "triggers",
    "api",
    # Every operator page; its ``admin`` module registers the ModelAdmins.
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "nrllm_ops.nul_in_request.RefuseNulInRequest",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "nrllm_ops.urls"
WSGI_APPLICATION = "nrllm_ops.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_default_database_url = f"sqlite:///{VAR_DIR / 'nrllm.sqlite3'}"
DATABASES = {
    "default": database_from_url(
        env_str("DATABASE_URL") or _default_database_url,
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0),
        prepared_statements=env_bool("DATABASE_PREPARED_STATEMENTS", True),
        # Unset: a pool of 20 on PostgreSQL unless DATABASE_CONN_MAX_AGE keeps
        # connections instead; 0 turns it off (ground/database.py).
        pool_max_size=env_int("DATABASE_POOL_MAX_SIZE", None, minimum=0),
        pool_timeout=env_int("DATABASE_POOL_TIMEOUT_SECONDS", 10, minimum=1),
    )
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The runs' created_at index includes the columns the overview groups by,
# for PostgreSQL to read it alone; SQLite (the embedded default) ignores
# an index's non-key columns, as intended, and Django would warn each start.
SILENCED_SYSTEM_CHECKS = ["models.W040"]
AUTH_PASSWORD_VALIDATORS = []
# A global permission is that role in every team; a team role grants it in
# its team only (teams.access scopes what each may see and do, G22).
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "teams.backends.TeamRoleBackend",
]
LANGUAGE_CODE = "en-us"
# Dates and moments written one way across the console (console/formats).
FORMAT_MODULE_PATH = ["console.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- The queue -------------------------------------------------------------
# Without REDIS_URL runs execute in-process when enqueued (the embedded
# default). With it, django-rq workers (`manage.py rqworker`) execute them.
REDIS_URL = env_str("REDIS_URL")
NRLLM_QUEUE_NAME = "default"
RQ_QUEUES = {
    NRLLM_QUEUE_NAME: {"URL": REDIS_URL or "redis://127.0.0.1:6379/0"},
}
# The default, runs.worker.ConcurrentWorker, keeps up to
# NRLLM_WORKER_CONCURRENCY runs in flight, each in a thread of its process,
# sharing the database pool (G15): a run spends nearly all its life waiting on
# a model. runs.worker.Worker (RQ's forking worker, a work horse per job, that
# also folds each horse's Prometheus files, ground/metrics_files.py) and
# runs.worker.SimpleWorker (RQ's SimpleWorker, loading what runs need at its
# start) execute one run at a time a process (bench/results.md compares
# them). The lease and the reaper cover a worker that dies, whichever it is.
# django-rq would also mount its dashboard inside the admin
# (/admin/django_rq/dashboard/), with its mutating views open to any staff
# user; it is mounted once instead, behind console.queue_dashboard.
RQ_SHOW_ADMIN_LINK = False
RQ = {"WORKER_CLASS": env_str("NRLLM_WORKER_CLASS", "runs.worker.ConcurrentWorker")}
# runs.worker.ConcurrentWorker executes up to this many runs at once, each in
# a thread of its process (G15), sharing the process's DATABASE_POOL_MAX_SIZE
# connections (with DATABASE_CONN_MAX_AGE instead, each thread keeps its own).
NRLLM_WORKER_CONCURRENCY = env_int("NRLLM_WORKER_CONCURRENCY", 100, minimum=1)
# On SIGTERM a ConcurrentWorker claims no more runs and waits this long for
# the runs in flight; the rest are handed back to the reaper, unsettled.
NRLLM_WORKER_DRAIN_SECONDS = env_int("NRLLM_WORKER_DRAIN_SECONDS", 30, minimum=0)
# Without Redis, a run waits for `manage.py embedded_worker` (as `make run`
# starts it beside the web server). True: the process that enqueues a run
# executes it there and then, in the caller's thread (tests, scripts).
NRLLM_EXECUTE_IN_CALLER = env_bool("NRLLM_EXECUTE_IN_CALLER", False)

# --- The runtime -----------------------------------------------------------
# Short: a background heartbeat renews the lease while a run is in flight
# (G16), so a worker that dies is noticed in about a lease.
NRLLM_LEASE_SECONDS = env_int("NRLLM_LEASE_SECONDS", 30, minimum=1)
NRLLM_MAX_REQUEUES = env_int("NRLLM_MAX_REQUEUES", 3, minimum=0)
NRLLM_MAX_ITERATIONS = env_int("NRLLM_MAX_ITERATIONS", 20, minimum=1)
NRLLM_RETRY_BACKOFF_SECONDS = env_int("NRLLM_RETRY_BACKOFF_SECONDS", 2, minimum=0)
NRLLM_RETRY_BACKOFF_MAX_SECONDS = env_int("NRLLM_RETRY_BACKOFF_MAX_SECONDS", 300, minimum=0)
# A queued run due this long ago whose job Redis no longer holds is
# dispatched again by the reaper (Redis restarted without persistence, say).
NRLLM_REDISPATCH_AFTER_SECONDS = env_int("NRLLM_REDISPATCH_AFTER_SECONDS", 60, minimum=1)
NRLLM_REAPER_INTERVAL_SECONDS = env_int("NRLLM_REAPER_INTERVAL_SECONDS", 10, minimum=1)
# Schedules (G23): how often rqcron's pass fires the slots that are due (the
# embedded worker fires them at each of its passes). A slot fires at most
# this late.
NRLLM_SCHEDULE_INTERVAL_SECONDS = env_int("NRLLM_SCHEDULE_INTERVAL_SECONDS", 5, minimum=1)
# Retention (manage.py prune_runs; runs/cron.py every interval when the age
# is set): ended runs older than this many days are deleted whole, unless
# an operator still has a question open on them. 0, the default, keeps
# every run.
NRLLM_RETENTION_DAYS = env_int("NRLLM_RETENTION_DAYS", 0, minimum=0, maximum=36500)
NRLLM_RETENTION_INTERVAL_SECONDS = env_int("NRLLM_RETENTION_INTERVAL_SECONDS", 3600, minimum=60)
# Runs per transaction: each batch holds its runs' row locks until it commits
# (and binds one parameter per run: PostgreSQL takes at most 65,535).
NRLLM_RETENTION_BATCH_SIZE = env_int("NRLLM_RETENTION_BATCH_SIZE", 500, minimum=1, maximum=10000)
# Added to a tool's time limit, or a model call's timeouts, for the deadline
# up to which the heartbeat keeps the lease through the call.
NRLLM_OPERATION_MARGIN_SECONDS = env_int("NRLLM_OPERATION_MARGIN_SECONDS", 30, minimum=0)
# The time limit of a tool that declares none (``timeout_seconds``).
NRLLM_TOOL_TIME_LIMIT_SECONDS = env_int("NRLLM_TOOL_TIME_LIMIT_SECONDS", 300, minimum=1)
# A PostgreSQL server that cannot make a commit durable (fsync = off) voids
# the fence and the journal's guarantees (G6, G12): /readyz answers 503 and
# the worker refuses to start, unless this says the operator knows (a
# throwaway database for tests or a demo).
NRLLM_ALLOW_NON_DURABLE_DATABASE = env_bool("NRLLM_ALLOW_NON_DURABLE_DATABASE", False)
NRLLM_HTTP_ALLOWED_HOSTS = env_list("NRLLM_HTTP_ALLOWED_HOSTS")
NRLLM_HTTP_TIMEOUT_SECONDS = env_int("NRLLM_HTTP_TIMEOUT_SECONDS", 10, minimum=1)
NRLLM_TOOLS = env_list("NRLLM_TOOLS")
# How long opening a session with an MCP server (or listing its tools) may
# take before the server counts as unreachable.
NRLLM_MCP_CONNECT_TIMEOUT_SECONDS = env_int("NRLLM_MCP_CONNECT_TIMEOUT_SECONDS", 10, minimum=1)

# --- Budgets (G17) -------------------------------------------------------------
# A run's limits when its request names none (0 or empty: none). Stored with
# the run when it is enqueued: a later change does not reach it.
NRLLM_RUN_MAX_TOTAL_TOKENS = env_int("NRLLM_RUN_MAX_TOTAL_TOKENS", 0, minimum=0) or None
NRLLM_RUN_MAX_COST = env_decimal("NRLLM_RUN_MAX_COST", maximum=10**9)
# Every user's budget unless an operator gave them one of their own (admin:
# Spend > Submitter budgets): per calendar day or month (UTC, the database's
# clock), in tokens and/or cost (0 or empty: no limit).
NRLLM_USER_BUDGET_PERIOD = env_choice("NRLLM_USER_BUDGET_PERIOD", "day", ("day", "month"))
NRLLM_USER_MAX_TOKENS = env_int("NRLLM_USER_MAX_TOKENS", 0, minimum=0) or None
NRLLM_USER_MAX_COST = env_decimal("NRLLM_USER_MAX_COST", maximum=10**9)
# Reservations before each model call under a submitter's budget (G21): the
# completion tokens reserved for a call whose request sets no max_tokens,
# and how long a call waits for room that calls in flight hold before its
# run stops budget_exhausted.
NRLLM_RESERVE_MAX_TOKENS = env_int("NRLLM_RESERVE_MAX_TOKENS", 4096, minimum=1, maximum=10**9)
NRLLM_RESERVATION_WAIT_SECONDS = env_int("NRLLM_RESERVATION_WAIT_SECONDS", 60, minimum=0)
# The currency prices and costs are in (shown beside them; never converted).
NRLLM_CURRENCY = env_str("NRLLM_CURRENCY", "USD")

# --- Approvals of writes (G14) -----------------------------------------------
# Which calls wait for an operator by default: non_idempotent_write, write
# (every write) or none. Per tool, operators may require it or (with the
# permission tools.relax_approval) waive it; a run's request may add tools.
NRLLM_APPROVAL_REQUIRED_FOR = env_choice(
    "NRLLM_APPROVAL_REQUIRED_FOR", "non_idempotent_write", ("non_idempotent_write", "write", "none")
)
# How long a call waits for a decision before its run ends failed/approval_expired.
NRLLM_APPROVAL_TIMEOUT_SECONDS = env_int("NRLLM_APPROVAL_TIMEOUT_SECONDS", 86400, minimum=1)
# Four-eyes: the user who submitted a run may deny its calls but not approve them
# (nor may the person who edited a call approve the edit, G24).
NRLLM_APPROVAL_SECOND_PERSON = env_bool("NRLLM_APPROVAL_SECOND_PERSON", False)
# How long the agent's question (ask_person) waits for an answer before its
# result says nobody answered (G24).
NRLLM_QUESTION_TIMEOUT_SECONDS = env_int("NRLLM_QUESTION_TIMEOUT_SECONDS", 86400, minimum=1)
# How long a deferred tool's call waits for its completion, unless the tool
# says (completion_timeout_seconds): then a non_idempotent_write is in doubt,
# a read or an idempotent write runs again with its key (G24).
NRLLM_COMPLETION_TIMEOUT_SECONDS = env_int("NRLLM_COMPLETION_TIMEOUT_SECONDS", 86400, minimum=1)
# Where this deployment is reached from outside (https://ops.example.com):
# a deferred call's completion URL starts with it. Empty: a path only.
NRLLM_PUBLIC_URL = env_http_url("NRLLM_PUBLIC_URL").rstrip("/")
# Posted (JSON) when a run starts to wait, through the SSRF-guarded HTTP
# client of the tools (its host need not be in NRLLM_HTTP_ALLOWED_HOSTS; a
# non-public address it resolves to must be); empty: no webhook. At most
# once per park, best effort (runs.approvals.webhook).
NRLLM_APPROVAL_WEBHOOK_URL = env_http_url("NRLLM_APPROVAL_WEBHOOK_URL")
# When set, each POST carries X-Nrllm-Signature-256: sha256=<HMAC-SHA256 of the body>.
NRLLM_APPROVAL_WEBHOOK_SECRET = env_str("NRLLM_APPROVAL_WEBHOOK_SECRET")
# The whole POST (connect, send, answer) ends by then; the run is parked already.
NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS = env_int(
    "NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1
)

# --- The run-ended webhook (G19) ---------------------------------------------------
# A run's request may name a "webhook" (http(s), to a host NRLLM_HTTP_ALLOWED_HOSTS
# allows): it is told, at least once, each time the run ends or starts to wait
# for approval (runs.run_webhooks).
# When set, each POST carries X-Nrllm-Signature-256: sha256=<HMAC-SHA256 of the body>.
NRLLM_RUN_WEBHOOK_SECRET = env_str("NRLLM_RUN_WEBHOOK_SECRET")
# The whole POST (connect, send, answer) ends by then.
NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS = env_int(
    "NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1, maximum=60
)
# After a failed attempt the event is due again after this, doubling with
# each attempt up to the maximum.
NRLLM_RUN_WEBHOOK_BACKOFF_SECONDS = env_int("NRLLM_RUN_WEBHOOK_BACKOFF_SECONDS", 10, minimum=1)
NRLLM_RUN_WEBHOOK_BACKOFF_MAX_SECONDS = env_int(
    "NRLLM_RUN_WEBHOOK_BACKOFF_MAX_SECONDS", 3600, minimum=1
)
# Attempts before an event is given up (gave_up_at, logged, counted).
NRLLM_RUN_WEBHOOK_MAX_ATTEMPTS = env_int(
    "NRLLM_RUN_WEBHOOK_MAX_ATTEMPTS", 12, minimum=1, maximum=100
)
# Events one reaper pass tries at most (it starts none after half the
# reaper's interval, either).
NRLLM_RUN_WEBHOOK_BATCH_SIZE = env_int(
    "NRLLM_RUN_WEBHOOK_BATCH_SIZE", 100, minimum=1, maximum=10000
)

# --- The OpenAI-compatible provider ------------------------------------------------
# Endpoint and key come from here only: never from a request, never stored.
# Checked as the webhook's is: a malformed one stops start-up, naming it (the
# worker builds its client at start, runs.workers.preload.load_for_runs). Set empty, it
# leaves the provider unconfigured.
NRLLM_OPENAI_BASE_URL = (
    env_http_url("NRLLM_OPENAI_BASE_URL")
    if "NRLLM_OPENAI_BASE_URL" in os.environ
    else "https://api.openai.com/v1"
)
NRLLM_OPENAI_API_KEY = env_str("NRLLM_OPENAI_API_KEY")
#: The body field a completion's bound is sent in: OpenAI's reasoning
#: models take only ``max_completion_tokens``; older compatible servers
#: only ``max_tokens``.
NRLLM_OPENAI_MAX_TOKENS_PARAMETER = env_choice(
    "NRLLM_OPENAI_MAX_TOKENS_PARAMETER", "max_tokens", ("max_tokens", "max_completion_tokens")
)
NRLLM_OPENAI_CONNECT_TIMEOUT_SECONDS = env_int("NRLLM_OPENAI_CONNECT_TIMEOUT_SECONDS", 5, minimum=1)
NRLLM_OPENAI_READ_TIMEOUT_SECONDS = env_int("NRLLM_OPENAI_READ_TIMEOUT_SECONDS", 120, minimum=1)
# The circuit breaker, per endpoint and model, shared by every worker.
NRLLM_CIRCUIT_FAILURES = env_int("NRLLM_CIRCUIT_FAILURES", 5, minimum=1)
NRLLM_CIRCUIT_WINDOW_SECONDS = env_int("NRLLM_CIRCUIT_WINDOW_SECONDS", 60, minimum=1)
NRLLM_CIRCUIT_COOLDOWN_SECONDS = env_int("NRLLM_CIRCUIT_COOLDOWN_SECONDS", 30, minimum=1)
# Shared rate limits per provider configuration and model, enforced across
# every worker through Redis before each model call (runs/runtime/rate_limit.py,
# docs/operations.md#shared-rate-limits): a JSON object, "kind:model" (or
# "kind:*") → {"requests_per_minute": n, "tokens_per_minute": n}.
NRLLM_PROVIDER_RATE_LIMITS = env_rate_limits("NRLLM_PROVIDER_RATE_LIMITS")
# The burst a limit lets through at once, in seconds of its rate (a bucket
# holds at most this much; one request at least).
NRLLM_RATE_LIMIT_BURST_SECONDS = env_int("NRLLM_RATE_LIMIT_BURST_SECONDS", 1, minimum=1, maximum=60)
# How long one model call may wait for its limit (or a provider's pause)
# before its attempt ends with rate_limit, retried as G8 says.
NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS = env_int(
    "NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS", 120, minimum=1, maximum=3600
)

# --- Observability -----------------------------------------------------------------
# /metrics answers a bearer token equal to this, or a staff session.
NRLLM_METRICS_TOKEN = env_str("NRLLM_METRICS_TOKEN")
LOG_FORMAT = env_str("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r} must be plain or json")
# OpenTelemetry traces: off unless the standard OTEL_* variables ask for them
# (docs/observability.md#traces); the span exporters they name, () when off.
NRLLM_TRACES_EXPORTERS = exporters_from_env()
# How long a process's exit (and an rqworker-pool worker's teardown) waits
# for the collector to take the last spans; those left are dropped.
NRLLM_TRACES_EXIT_SECONDS = env_int("NRLLM_TRACES_EXIT_SECONDS", 3, minimum=0, maximum=60)

# --- The console ---------------------------------------------------------------------
# A page showing something in flight (a run queued, running or waiting, a call
# waiting for approval) asks for itself again this often; 0: never.
NRLLM_LIVE_POLL_SECONDS = env_int("NRLLM_LIVE_POLL_SECONDS", 5, minimum=0, maximum=3600)

# --- The REST API ---------------------------------------------------------------
NRLLM_API_THROTTLE_RATE = env_str("NRLLM_API_THROTTLE_RATE", "1200/minute")
NRLLM_API_MAX_BODY_BYTES = env_int("NRLLM_API_MAX_BODY_BYTES", 1_048_576, minimum=1024)
NRLLM_API_TOKEN_TTL_DAYS = env_int("NRLLM_API_TOKEN_TTL_DAYS", 0, minimum=0)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so an anonymous request is answered 401 with WWW-Authenticate.
        "api.authentication.ScopedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_THROTTLE_CLASSES": ["api.throttling.PerTokenThrottle"],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
# Named, so that a table pointing at tokens (teams.TokenScope) can migrate.
KNOX_TOKEN_MODEL = "knox.AuthToken"
REST_KNOX = {
    # Tokens are stored hashed; 0 days = no expiry (revoke by deleting).
    "TOKEN_TTL": timedelta(days=NRLLM_API_TOKEN_TTL_DAYS) if NRLLM_API_TOKEN_TTL_DAYS else None,
    "AUTO_REFRESH": False,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "nrllm-ops API",
    "DESCRIPTION": "Start agent runs, follow them, and act on failures. "
    "A tool's effect is returned, never accepted.",
    "VERSION": "1.0.0",
    # 3.1: the run-ended webhook is described under the root's "webhooks".
    "OAS_VERSION": "3.1.0",
    "WEBHOOKS": ["api.run_ended_webhook.RUN_ENDED"],
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "ToolEffectEnum": "runs.models.EFFECT_CHOICES",
        # Two choice sets in fields named "status": a run's, an approval's.
        "RunStatusEnum": "runs.models.vocabulary.RunStatus",
        "ApprovalStatusEnum": "runs.models.vocabulary.ApprovalStatus",
        # Named for what it is: other resources may have a field "approval".
        "ApprovalPolicyEnum": "tools.approval_policy.ApprovalPolicy",
        # Two choice sets in fields named "kind": a step's, a waiting call's (G24).
        "StepKindEnum": "runs.models.vocabulary.StepKind",
        "WaitKindEnum": "runs.models.vocabulary.WaitKind",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "ground.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # The MCP SDK's HTTP client logs every request's URL at INFO, and an
    # MCP server's URL may hold a credential (userinfo, a token in the query);
    # so does httpx, for the webhooks' POSTs (a hook's token in its path or query).
    "loggers": {"httpx2": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}
