"""django-rq's dashboard: staff may look, only a superuser may change the
queue (``console.queue_dashboard``), against the real Redis."""

import uuid

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver
from redis import Redis
from rq.command import PUBSUB_CHANNEL_TEMPLATE
from rq.registry import FailedJobRegistry

from console.queue_dashboard import superuser_unless_read_only
from runs.queue.dispatch import run_queue

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/django-rq/"
#: The worker the queued job claims to run on: a stop command goes to its
#: channel. Pub/sub channels span Redis' databases, so each process has its own.
WORKER = f"worker-under-a-run-{uuid.uuid4().hex}"


@pytest.fixture
def queue(queue):
    """The deployment's queue (emptied as the suite's): the one django-rq's
    dashboard lists (``RQ_QUEUES``), not a team's."""
    return run_queue()


@pytest.fixture
def jobs(queue):
    """A queued job a worker is said to be running, and a failed one."""
    queued = queue.enqueue("os.getcwd")
    queued.worker_name = WORKER
    queued.save()
    failed = queue.create_job("os.getcwd")
    failed.save()
    FailedJobRegistry(queue=queue).add(failed, ttl=600, exc_string="boom")
    return queued, failed


def mutating_requests(queued_id, failed_id):
    """(method, path, data): every way the dashboard changes the queue,
    confirmation pages included."""
    queue = f"{DASHBOARD}queues/0/"
    pages = [
        f"{queue}failed/clear/",
        f"{queue}empty/",
        f"{queue}requeue-all/",
        f"{queue}{queued_id}/delete/",
        f"{queue}{failed_id}/requeue/",
        f"{queue}{failed_id}/enqueue/",
        f"{queue}{queued_id}/stop/",
    ]
    bulk = [
        (f"{DASHBOARD}queues/confirm-action/0/", {"action": action, "_selected_action": queued_id})
        for action in ("delete", "requeue", "stop")
    ] + [
        (f"{DASHBOARD}queues/actions/0/", {"action": action, "job_ids": queued_id})
        for action in ("delete", "requeue", "stop")
    ]
    return [
        *[("get", page, {}) for page in pages],
        *[("post", page, {}) for page in pages],
        *[("get", path, {}) for path, _ in bulk],
        *[("post", path, data) for path, data in bulk],
        # A read-only page is read-only for GET alone.
        ("post", queue, {}),
        ("post", DASHBOARD, {}),
    ]


def redis_state(connection) -> dict:
    """Every key with its serialized value: equal means nothing changed."""
    return {key: connection.dump(key) for key in sorted(connection.keys())}


def test_a_staff_user_without_the_right_cannot_change_the_queue_from_the_dashboard(
    viewer_client, queue, jobs
):
    queued, failed = jobs
    before = redis_state(queue.connection)
    commands = queue.connection.pubsub()
    commands.subscribe(PUBSUB_CHANNEL_TEMPLATE % WORKER)
    commands.get_message(timeout=1)  # the subscription's confirmation
    for method, path, data in mutating_requests(queued.id, failed.id):
        response = getattr(viewer_client, method)(path, data)
        assert response.status_code == 403, (method, path, response.status_code)
    assert redis_state(queue.connection) == before
    assert queue.job_ids == [queued.id]
    assert FailedJobRegistry(queue=queue).get_job_ids() == [failed.id]
    assert commands.get_message(timeout=0.2) is None  # no worker was told to stop
    commands.close()


def test_a_staff_user_without_the_right_cannot_stop_a_job_from_the_dashboard(
    viewer_client, admin_client, queue, jobs
):
    queued, _ = jobs
    commands = queue.connection.pubsub()
    commands.subscribe(PUBSUB_CHANNEL_TEMPLATE % WORKER)
    commands.get_message(timeout=1)
    stop = f"{DASHBOARD}queues/0/{queued.id}/stop/"
    assert viewer_client.post(stop).status_code == 403
    assert commands.get_message(timeout=0.2) is None
    assert admin_client.post(stop).status_code == 302
    assert b"stop-job" in commands.get_message(timeout=2)["data"]
    commands.close()


def test_staff_may_still_look_at_the_dashboard(viewer_client, queue, jobs):
    queued, failed = jobs
    for path in [
        DASHBOARD,
        f"{DASHBOARD}queues/0/",
        f"{DASHBOARD}queues/0/details/",
        f"{DASHBOARD}queues/0/failed/",
        f"{DASHBOARD}queues/0/{queued.id}/",
        f"{DASHBOARD}workers/0/",
    ]:
        assert viewer_client.get(path).status_code == 200, path


def test_without_redis_the_dashboard_says_so_in_the_admins_frame_and_asks_no_redis(
    viewer_client, admin_client, client, settings
):
    """``make run`` has no ``REDIS_URL``; django-rq's ``RQ_QUEUES`` then points
    at a local Redis that is none of this deployment's (a 500 when nothing
    listens there). The suite's settings are the same, but ``RQ_QUEUES``
    points at the test's Redis, where django-rq's views would answer: its
    home lists the queue, its ``empty`` view empties it."""
    assert not settings.REDIS_URL
    redis = Redis.from_url(settings.TEST_REDIS_URL)
    redis.rpush(f"rq:queue:{settings.NRLLM_QUEUE_NAME}", "someone-elses-job")
    for who in (viewer_client, admin_client):
        for method, path in [
            ("get", DASHBOARD),
            ("get", f"{DASHBOARD}queues/0/"),
            ("get", f"{DASHBOARD}stats.json/"),
            ("post", f"{DASHBOARD}queues/0/empty/"),
        ]:
            response = getattr(who, method)(path)
            assert response.status_code == 200, (method, path)
            content = response.content.decode()
            assert 'id="no-redis-queue"' in content, (method, path)
            assert "<strong>no Redis queue</strong>" in content
            # The admin's frame: its header, breadcrumbs and navigation.
            assert 'id="site-name"' in content and 'id="nav-sidebar"' in content
            assert '<ol class="breadcrumbs">' in content
            assert "rq:queue" not in content and "Queued Jobs" not in content
    assert redis.lrange(f"rq:queue:{settings.NRLLM_QUEUE_NAME}", 0, -1) == [b"someone-elses-job"]
    redis.delete(f"rq:queue:{settings.NRLLM_QUEUE_NAME}")
    # Still behind the staff check, and not linked from the overview.
    assert client.get(DASHBOARD).status_code == 302
    assert 'href="/admin/django-rq/"' not in viewer_client.get("/admin/").content.decode()


def test_a_superuser_can_change_the_queue_from_the_dashboard(admin_client, queue, jobs):
    queued, failed = jobs
    for method, path, _ in mutating_requests(queued.id, failed.id):
        if method == "get" and "/stop/" not in path and "action" not in path:
            assert admin_client.get(path).status_code == 200, path
    response = admin_client.post(f"{DASHBOARD}queues/0/{queued.id}/delete/")
    assert response.status_code == 302
    assert queue.job_ids == [] and queue.fetch_job(queued.id) is None
    assert admin_client.post(f"{DASHBOARD}queues/0/requeue-all/").status_code == 302
    assert queue.job_ids == [failed.id]
    assert admin_client.post(f"{DASHBOARD}queues/0/empty/").status_code == 302
    assert queue.job_ids == []


def test_anyone_else_is_sent_to_the_login_page(outsider_client, client, queue, jobs):
    queued, _ = jobs
    for who in (outsider_client, client):
        response = who.post(f"{DASHBOARD}queues/0/{queued.id}/delete/")
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
        # Read-only views too, django-rq's token-authenticated ones included.
        for path in [DASHBOARD, f"{DASHBOARD}stats.json/", f"{DASHBOARD}metrics/"]:
            response = who.get(path)
            assert response.status_code == 302, (path, response.status_code)
            assert "/admin/login/" in response["Location"], path
    assert queue.job_ids == [queued.id]


@pytest.mark.parametrize("token", ["%C3%A9", "%D9%A1", "abc%C3%A9"])
def test_a_non_ascii_stats_token_is_never_a_500(client, viewer_client, queue, token):
    """``stats.json/<token>/`` takes Unicode letters (``[\\w]+``), and
    django-rq's ``compare_digest`` raises on a non-ASCII str: anyone but
    staff is sent to log in, staff get a 404; neither reaches it."""
    client.raise_request_exception = viewer_client.raise_request_exception = False
    path = f"{DASHBOARD}stats.json/{token}/"
    anonymous = client.get(path)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    assert viewer_client.get(path).status_code == 404
    assert viewer_client.get(f"{DASHBOARD}stats.json/abc/").status_code == 200


def test_a_restricted_metrics_request_is_refused_and_hides_no_metric(viewer_client, queue):
    """django-rq's ``metrics`` replaces its process-wide registry with one
    restricted to ``name[]``: every later scrape would lack the rest."""
    metrics = f"{DASHBOARD}metrics/"
    assert viewer_client.get(metrics, {"name[]": "rq_workers"}).status_code == 400
    response = viewer_client.get(metrics)
    assert response.status_code == 200
    assert b"rq_workers" in response.content and b"rq_jobs" in response.content


def _callbacks(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _callbacks(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.callback


def test_every_door_into_the_dashboard_is_guarded_and_an_unlisted_view_is_refused(
    viewer, viewer_client, queue
):
    doors = [
        (route, callback)
        for route, callback in _callbacks(get_resolver().url_patterns)
        if callback.__module__.startswith("django_rq")
    ]
    assert len(doors) > 20
    assert [
        route for route, callback in doors if not hasattr(callback, "guards_queue_dashboard")
    ] == []
    # django-rq's own mount inside the admin is not registered.
    assert viewer_client.get("/admin/django_rq/dashboard/queues/0/empty/").status_code == 404

    # A view an upgrade adds is refused until it is listed as read-only.
    def new_view(request):
        raise AssertionError("reached")

    request = RequestFactory().get(f"{DASHBOARD}queues/0/new/")
    request.user = viewer
    with pytest.raises(PermissionDenied):
        superuser_unless_read_only(new_view, "new_view")(request)
