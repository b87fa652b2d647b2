"""G19 per team: a team's own run-webhook secret signs its runs' events, so
one team's receiver never takes another team's events as its own; a team
without one signs with the deployment's ``NRLLM_RUN_WEBHOOK_SECRET``."""

import hashlib
import hmac
import json

import pytest

from runs.runtime import enqueue
from tests.helpers import fresh, scripted
from tests.webhook_receiver import SECRET, Receiver

pytestmark = pytest.mark.django_db(transaction=True)

SECRETS = {"alpha": "alpha-signs-its-own", "bravo": "bravo-signs-its-own"}


def verified(secret: str, headers: dict, body: bytes) -> bool:
    """As a receiver checks it: the HMAC-SHA256 of the body's bytes."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("x-nrllm-signature-256", ""), expected)


@pytest.fixture
def receivers(settings):
    """One receiver a team, started, the run-ended webhook's deployment
    secret ``SECRET``."""
    started = {slug: Receiver() for slug in ("alpha", "bravo", "default")}
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{each.port}" for each in started.values()]
    settings.NRLLM_RUN_WEBHOOK_SECRET = SECRET
    for each in started.values():
        each.start()
    yield started
    for each in started.values():
        each.stop()


def test_each_teams_receiver_verifies_its_own_events_and_no_other_teams(
    receivers, operator, two_teams
):
    alpha, bravo = two_teams
    for team in two_teams:
        team.webhook_secret = SECRETS[team.slug]
        team.save(update_fields=["webhook_secret"])
    runs = {
        "alpha": enqueue(
            {**scripted({"content": "a"}), "webhook": receivers["alpha"].url()},
            submitted_by=operator,
            team=alpha,
        ),
        "bravo": enqueue(
            {**scripted({"content": "b"}), "webhook": receivers["bravo"].url()},
            submitted_by=operator,
            team=bravo,
        ),
        # The default team has no secret of its own: the deployment's signs.
        "default": enqueue(
            {**scripted({"content": "d"}), "webhook": receivers["default"].url()},
            submitted_by=operator,
        ),
    }
    assert {fresh(run).status for run in runs.values()} == {"completed"}
    secrets = {**SECRETS, "default": SECRET}
    for slug, receiver in receivers.items():
        (posted,) = receiver.posts
        headers, body = posted
        assert json.loads(body)["run"]["id"] == str(runs[slug].pk)
        # The team is named inside what is signed, for a receiver to check.
        assert json.loads(body)["run"]["team"] == slug
        assert verified(secrets[slug], headers, body), slug
        # Signed by no other team's secret, nor the deployment's.
        assert not any(
            verified(secret, headers, body) for other, secret in secrets.items() if other != slug
        ), slug
    # The team's secret is in no body or header it sends.
    for receiver in receivers.values():
        (posted,) = receiver.posts
        headers, body = posted
        for secret in SECRETS.values():
            assert secret not in body.decode() and secret not in json.dumps(headers)
