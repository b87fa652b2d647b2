"""Schemathesis against our own OpenAPI schema: generated requests to every
endpoint find no 5xx and no response that the schema does not describe."""

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from nrllm_ops.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def keep_test_connection():
    """Calls go straight to the WSGI app, whose request signals would close
    the test's database connection; Django's test client disconnects them too."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def authorization(operator, api_token, settings, keep_test_connection):
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    settings.NRLLM_API_THROTTLE_RATE = "100000/minute"
    return api_token(operator)


@pytest.mark.slow
@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_the_api_keeps_to_its_schema(case, authorization):
    case.call_and_validate(headers={"Authorization": authorization}, checks=CHECKS)
