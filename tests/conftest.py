"""Fixtures: the in-process runtime, the real Redis queue, real rqworker
processes, a local HTTP server and the database fault injector."""

import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing

import psutil
import pytest
from django.conf import settings as django_settings
from django.db import connection

from runs.queue.dispatch import run_queue
from teams.models import DEFAULT_TEAM_ID
from tests.helpers import ROOT, manage, sqlite_env
from tests.http_fixture import TestResolver, start_http_server
from tests.mcp_fixtures import http_tracker, tracker  # noqa: F401 (fixtures)
from tests.processes import WorkerProcess
from tests.redis_server import own_redis  # noqa: F401 (a fixture)
from tests.webhook_receiver import receiver  # noqa: F401 (a fixture)


def pytest_collection_modifyitems(items):
    """Give each schemathesis item (one per API operation, named
    ``test[GET /api/...]``) a node id of its own. Under pytest 9.2 they all
    get their test function's, and xdist keys its work by node id: with
    ``--dist loadgroup`` it ran one operation per schemathesis test and
    dropped the others without a word. ``test_api_schema.py`` checks each
    item's id, so a pytest that no longer has ``_id`` fails there."""
    from _pytest.nodeid import NodeId

    for item in items:
        label = getattr(item, "operation_label", None)
        if label and hasattr(item, "_id") and item._id.params is None:
            item._id = NodeId.parse(f"{item.nodeid}[{label}]")


def pytest_terminal_summary(terminalreporter):
    """Print what tests recorded as their ``summary`` (the soak's counts)."""
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get(
        "failed", []
    ):
        for name, value in getattr(report, "user_properties", []):
            if name == "summary" and report.when == "call":
                terminalreporter.write_line(value)


#: The rows ``post_migrate`` makes: content types, permissions, and a
#: settings row per registered tool (``tools.apps``).
POST_MIGRATE_TABLES = (
    "django_content_type",
    "auth_permission",
    "tools_toolsetting",
    "teams_team",
)


@pytest.fixture(scope="session", autouse=True)
def post_migrate_rows_kept(django_db_setup, django_db_blocker):
    """A transactional test ends with a flush that empties every table and
    sends ``post_migrate``, which makes those rows again: 50 of the flush's
    70 ms, after some 540 tests. The flush here does not send it; the rows
    the migrated database had are copied back instead (the same rows, with
    the same ids)."""
    from django.core.management import call_command
    from django.db import connections
    from django.test import TransactionTestCase

    if not connection.settings_dict["NAME"].startswith("test_"):
        yield  # no test collected uses the database: none was made
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for table in POST_MIGRATE_TABLES:
            cursor.execute(f"DROP TABLE IF EXISTS kept_{table}")
            cursor.execute(f"CREATE TABLE kept_{table} AS TABLE {table}")

    flush_and_send_post_migrate = TransactionTestCase._fixture_teardown

    def flush_keeping_post_migrate_rows(test_case):
        if test_case.available_apps is not None or test_case.serialized_rollback:
            return flush_and_send_post_migrate(test_case)
        for alias in test_case._databases_names(include_mirrors=False):
            call_command(
                "flush",
                verbosity=0,
                interactive=False,
                database=alias,
                reset_sequences=False,
                allow_cascade=False,
                inhibit_post_migrate=True,
            )
            with connections[alias].cursor() as cursor:
                for table in POST_MIGRATE_TABLES:
                    cursor.execute(f"INSERT INTO {table} SELECT * FROM kept_{table}")

    TransactionTestCase._fixture_teardown = flush_keeping_post_migrate_rows
    yield
    TransactionTestCase._fixture_teardown = flush_and_send_post_migrate


@pytest.fixture(scope="session")
def migrated(tmp_path_factory):
    """``migrated(path)`` puts at ``path`` a copy of a SQLite database
    migrated once for the test process (a process and several seconds of
    CPU each): for the tests of the embedded default whose subject comes
    after the migrations. ``make run``'s own set-up and the migrations
    themselves are tested from an empty file (``test_embedded_default``)."""
    template = tmp_path_factory.mktemp("migrated") / "template.sqlite3"
    done = manage("migrate", "--noinput", env=sqlite_env(template))
    assert done.returncode == 0, done.stderr[-2000:]

    def copy_to(path):
        # SQLite's own copy: whatever a write-ahead log still held comes too.
        with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as copy:
            source.backup(copy)

    return copy_to


@pytest.fixture
def http_server(settings):
    """A local HTTP server the HTTP tools are allowed to reach."""
    server = start_http_server()
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [server.host]
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def dns(monkeypatch):
    """The HTTP tools' host names resolve through this ``TestResolver``
    instead of the system's, in this test only. It stands in for DNS, the
    network edge, and for nothing else: the guard installs nothing
    else at ``http_guard.resolver``, and everything after the lookup (the
    checks, the pinned connection) runs as in production. Subprocess workers
    keep the system resolver; give them IP literals."""
    from tools.builtin import http_guard

    resolver = TestResolver()
    monkeypatch.setattr(http_guard, "resolver", resolver)
    return resolver


@pytest.fixture
def queue(settings):
    """Dispatch through the real Redis (this xdist worker's own database),
    emptied before the test; the queue of the default team's runs due now."""
    settings.REDIS_URL = django_settings.TEST_REDIS_URL
    rq_queue = run_queue(DEFAULT_TEAM_ID)
    rq_queue.connection.flushdb()
    yield rq_queue
    rq_queue.connection.flushdb()


def _database_url() -> str:
    # The test database pytest-django created (test_nrllm, test_nrllm_gw0, ...).
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture
def worker_env():
    """Environment for a subprocess of the app against the test database and Redis."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "nrllm_ops.settings",
        "DATABASE_URL": _database_url(),
        "REDIS_URL": django_settings.TEST_REDIS_URL,
        "SECRET_KEY": "tests-only-secret-key",
        "PYTHONUNBUFFERED": "1",
        # As in tests/settings.py; the `approvals` fixture turns them on.
        "NRLLM_APPROVAL_REQUIRED_FOR": django_settings.NRLLM_APPROVAL_REQUIRED_FOR,
        # As in tests/settings.py: a stdio server's start on a loaded host.
        "NRLLM_MCP_CONNECT_TIMEOUT_SECONDS": str(django_settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS),
    }


class Workers:
    """Starts real ``manage.py rqworker`` processes and always stops them."""

    def __init__(self, env):
        self.env = env
        self.processes: list[WorkerProcess] = []

    def start(self, *, burst=False, with_scheduler=False, **env_overrides) -> WorkerProcess:
        arguments = ["rqworker", django_settings.NRLLM_QUEUE_NAME]
        if burst:
            arguments.append("--burst")
        if with_scheduler:
            arguments.append("--with-scheduler")
        return self.start_command(*arguments, **env_overrides)

    def start_command(self, *arguments: str, **env_overrides) -> WorkerProcess:
        """``manage.py`` with ``arguments`` (``rqcron runs.cron``), as a worker is started."""
        process = WorkerProcess(
            [sys.executable, "manage.py", *arguments],
            cwd=ROOT,
            env={
                **self.env,
                # Read now, so a test's own settings (http_server's host) apply.
                "NRLLM_HTTP_ALLOWED_HOSTS": ",".join(django_settings.NRLLM_HTTP_ALLOWED_HOSTS),
                "NRLLM_TOOLS": ",".join(django_settings.NRLLM_TOOLS),
                "NRLLM_OPENAI_BASE_URL": django_settings.NRLLM_OPENAI_BASE_URL,
                "NRLLM_OPENAI_API_KEY": django_settings.NRLLM_OPENAI_API_KEY,
                "NRLLM_APPROVAL_REQUIRED_FOR": django_settings.NRLLM_APPROVAL_REQUIRED_FOR,
                "NRLLM_APPROVAL_SECOND_PERSON": str(django_settings.NRLLM_APPROVAL_SECOND_PERSON),
                **{key: str(value) for key, value in env_overrides.items()},
            },
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def run_burst(self, timeout=60, **env_overrides) -> str:
        """Run one burst worker until the queue is drained; return its output.
        ``timeout``: seconds it may show no progress (``WorkerProcess.ended``)."""
        process = self.start(burst=True, **env_overrides)
        output = process.ended(timeout)
        assert process.returncode == 0, output.decode()
        return output.decode()

    @staticmethod
    def signal(process: subprocess.Popen, signum: int) -> None:
        """Signal the worker and its work horse. RQ puts the horse in a
        process group of its own, so the tree is walked, horse first."""
        try:
            tree = psutil.Process(process.pid)
            members = [*tree.children(recursive=True), tree]
        except psutil.NoSuchProcess:
            return
        for member in members:
            try:
                member.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL the worker and its work horse, and reap them."""
        self.signal(process, signal.SIGKILL)
        process.communicate(timeout=30)

    def stop_all(self):
        for process in self.processes:
            if process.poll() is None:
                self.signal(process, signal.SIGKILL)
            process.communicate(timeout=30)


@pytest.fixture
def workers(queue, worker_env):
    pool = Workers(worker_env)
    yield pool
    pool.stop_all()


# --- the fixed cast of users -------------------------------------------------

OPERATOR_PERMISSIONS = [
    "runs.view_agentrun",
    "runs.requeue_agentrun",
    "runs.cancel_agentrun",
    "runs.reconcile_agentrun",
    "runs.view_deadletter",
    "runs.dismiss_deadletter",
    "tools.view_toolsetting",
    "tools.change_toolsetting",
    "tools.relax_approval",
    "runs.approve_write",
    # An approver releases only writes they could make (G22).
    "runs.add_agentrun",
    "agents.view_agent",
    "agents.add_agent",
    "agents.change_agent",
]
APPROVER_PERMISSIONS = ["runs.view_agentrun", "runs.approve_write", "runs.add_agentrun"]
VIEWER_PERMISSIONS = [
    "runs.view_agentrun",
    "runs.view_deadletter",
    "tools.view_toolsetting",
    "agents.view_agent",
]


def _user(username, *, staff, permissions):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username, password="pw", is_staff=staff)
    for dotted in permissions:
        app_label, codename = dotted.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


@pytest.fixture
def operator(db):
    """Olivia, staff, with every operator permission."""
    return _user("olivia", staff=True, permissions=OPERATOR_PERMISSIONS)


@pytest.fixture
def screenshots(tmp_path):
    """Where the browser tests' screenshots go: the manual's (docs/), with `make
    screenshots` (NRLLM_UPDATE_SCREENSHOTS=1); otherwise a temporary folder,
    so a test run leaves the work tree clean."""
    from tests.browser import DOCS_SCREENSHOTS

    update = os.environ.get("NRLLM_UPDATE_SCREENSHOTS") == "1"
    folder = DOCS_SCREENSHOTS if update else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def approver(db):
    """Ada, staff, who may look at runs, start them (an approver releases
    only writes they could make, G22) and approve or deny their calls."""
    return _user("ada", staff=True, permissions=APPROVER_PERMISSIONS)


@pytest.fixture
def approvals(settings):
    """Approvals as shipped: every non_idempotent_write waits for one (the
    suite's settings turn them off; workers started after this read it)."""
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "non_idempotent_write"
    return settings


@pytest.fixture
def viewer(db):
    """Victor, staff, who may look but not act."""
    return _user("victor", staff=True, permissions=VIEWER_PERMISSIONS)


@pytest.fixture
def outsider(db):
    """Oscar, a user who is not staff."""
    return _user("oscar", staff=False, permissions=[])


@pytest.fixture
def orm_beside_the_browser(monkeypatch):
    """Playwright's sync API keeps an event loop in the test's thread, where
    Django then refuses every query (``SynchronousOnlyOperation``). The
    test's own queries are synchronous and safe beside it: allowed. An edge
    of the browser driver, not of the code under test."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def two_teams(db):
    """Alpha and Bravo, two teams beside the default one (G22)."""
    from teams.models import Team

    return (
        Team.objects.create(name="Alpha", slug="alpha"),
        Team.objects.create(name="Bravo", slug="bravo"),
    )


@pytest.fixture
def member(db):
    """``member(username, team, *roles)`` → a staff user holding ``roles``
    (every role if none is named) in ``team`` and no global permission."""
    from django.contrib.auth import get_user_model

    from teams.models import Membership
    from teams.roles import Role

    def make(username, team, *roles):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
        for role in roles or Role.values:
            Membership.objects.get_or_create(user=user, team=team, role=role)
        return user

    return make


def _client_for(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator_client(operator):
    return _client_for(operator)


@pytest.fixture
def approver_client(approver):
    return _client_for(approver)


@pytest.fixture
def viewer_client(viewer):
    return _client_for(viewer)


@pytest.fixture
def outsider_client(outsider):
    return _client_for(outsider)


@pytest.fixture
def api_token():
    """``api_token(user)`` → an ``Authorization`` header value for that user."""
    from knox.models import AuthToken

    def make(user):
        _, token = AuthToken.objects.create(user=user)
        return f"Token {token}"

    return make


@pytest.fixture
def api(operator, api_token):
    """An API client authenticated with a token of the operator's, who may
    also create runs."""
    from django.contrib.auth.models import Permission
    from rest_framework.test import APIClient

    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api_token(operator))
    return client


@pytest.fixture
def fake_openai(settings):
    """A local chat-completions server, configured as the openai provider's endpoint."""
    from tests.fake_openai import start_fake_openai

    fake = start_fake_openai()
    settings.NRLLM_OPENAI_BASE_URL = fake.base_url
    settings.NRLLM_OPENAI_API_KEY = "sk-test-not-a-real-key"
    settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS = 5
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def model(request):
    """The provider under test, parametrized over ``tests.drifting_model.MODELS``
    (``indirect=True``): None for ``scripted``, or the drifting model (which
    needs the fake chat-completions server)."""
    if request.param == "drifting":
        return request.getfixturevalue("drifting_model")
    return None


@pytest.fixture
def drifting_model(fake_openai):
    """The fake server's model words every answer differently (``tests.drifting_model``)."""
    from tests.drifting_model import DriftingModel

    model = DriftingModel()
    fake_openai.brain = model
    yield model
    model.release.set()
