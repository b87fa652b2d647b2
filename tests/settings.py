"""Settings for the test suite: the real app settings, pointed at the
throwaway PostgreSQL and Redis that ``tests.harness`` started."""

import os

from django.core.exceptions import ImproperlyConfigured

from ground.database import database_from_url
from nrllm_ops.settings import *  # noqa: F403

try:
    _database_url = os.environ["NRLLM_TEST_DATABASE_URL"]
    _redis_base_url = os.environ["NRLLM_TEST_REDIS_URL"]
except KeyError as missing:
    raise ImproperlyConfigured(
        f"{missing} is not set: run the tests with `make test`, which starts "
        "PostgreSQL and Redis for them"
    ) from None

# Unpooled (pool_max_size=0) in the suite's own process; the worker, web and
# command processes the tests start read nrllm_ops.settings, and get the
# shipped default pool.
DATABASES = {"default": database_from_url(_database_url, conn_max_age=0, prepared_statements=True)}

# Each xdist worker gets a Redis database of its own.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
TEST_REDIS_URL = f"{_redis_base_url}/{int(_worker.removeprefix('gw')) + 1}"
RQ_QUEUES = {NRLLM_QUEUE_NAME: {"URL": TEST_REDIS_URL}}  # noqa: F405
# Tests execute in-process unless they opt into the queue (the `queue` fixture):
# a run enqueued executes in the test's thread (the embedded default's tests
# run real `manage.py` processes on the shipped setting instead).
REDIS_URL = ""
NRLLM_EXECUTE_IN_CALLER = True

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SECRET_KEY = "tests-only-secret-key"

# Approvals (G14) are off unless a test asks for them (the `approvals`
# fixture): the tests of the other guarantees run writes unattended, as a
# deployment with NRLLM_APPROVAL_REQUIRED_FOR=none does. The shipped default
# (non_idempotent_write) is pinned by test_approval_policy.py.
NRLLM_APPROVAL_REQUIRED_FOR = "none"

# The tests' stdio MCP servers are Python processes that import the SDK
# (seconds of CPU), started anew by the suite's process and by every work
# horse: on a loaded host that takes longer than the shipped 10 s, and a
# listing would find the server unreachable only because the host is busy.
# A server that never answers is still found; the tests of that bound set
# their own. Workers started by the tests get the same (tests/conftest.py).
NRLLM_MCP_CONNECT_TIMEOUT_SECONDS = 60
