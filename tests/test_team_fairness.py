"""G22 for workers: they take the teams' runs in turn, and a team's cap on
runs in flight is never passed. Real PostgreSQL, Redis and rqworkers
(the concurrent worker class, the default)."""

import pytest
from django.db import connection

from runs import transitions
from runs.models import AgentRun, HeldRun
from runs.models.vocabulary import RunStatus
from runs.queue.dispatch import job_id_for, run_queue
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from runs.worker import ConcurrentWorker
from tests.helpers import answer, rows_locked_elsewhere, scripted, wait_until
from tests.test_concurrent_worker import CONCURRENT

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.mark.worker
def test_a_teams_ten_runs_start_ahead_of_another_teams_backlog_of_a_thousand(
    workers, queue, two_teams
):
    """Alpha enqueues 1,000 runs while a worker with 10 slots works through
    them; then Bravo enqueues 10. Bravo's runs are taken in turn with
    Alpha's, not after them: each of Bravo's 10 starts before 50 more of
    Alpha's have (first in, first out would start the whole backlog first)."""
    alpha, bravo = two_teams
    slow = scripted(answer("a", delay_seconds=0.5))
    workers.start(**{**CONCURRENT, "NRLLM_WORKER_CONCURRENCY": 10, "NRLLM_LEASE_SECONDS": 10})
    for _ in range(1000):
        enqueue(slow, team=alpha)
    bravos = [enqueue(scripted(answer("b")), team=bravo) for _ in range(10)]
    wait_until(
        lambda: (
            not AgentRun.objects.filter(pk__in=[run.pk for run in bravos])
            .exclude(status=RunStatus.COMPLETED)
            .exists()
        ),
        timeout=30,
        what="Bravo's ten runs",
    )
    last_bravo = max(AgentRun.objects.filter(team=bravo).values_list("started_at", flat=True))
    enqueued = min(run.created_at for run in AgentRun.objects.filter(team=bravo))
    alpha_meanwhile = AgentRun.objects.filter(
        team=alpha, started_at__gt=enqueued, started_at__lte=last_bravo
    ).count()
    alpha_waiting = AgentRun.objects.filter(team=alpha, status=RunStatus.QUEUED).count()
    assert alpha_meanwhile < 50, alpha_meanwhile
    assert alpha_waiting > 500, "the backlog was drained before Bravo came: no test of fairness"


@pytest.fixture
def observed_running():
    """A database trigger that notes, after every run becomes ``running``,
    how many of its team's runs are running as that transaction sees them.
    The cap's claims take one team lock each until they commit, so a capped
    team's count is exact."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE seen_running (team_id bigint, running int)")
        cursor.execute(
            """
            CREATE FUNCTION note_running() RETURNS trigger AS $$ BEGIN
                INSERT INTO seen_running SELECT NEW.team_id, count(*) FROM runs_agentrun
                    WHERE team_id = NEW.team_id AND status = 'running';
                RETURN NULL;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER note_running AFTER UPDATE OF status ON runs_agentrun FOR EACH ROW
                WHEN (NEW.status = 'running' AND OLD.status <> 'running')
                EXECUTE FUNCTION note_running();
            """
        )

    def most(team) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT max(running) FROM seen_running WHERE team_id = %s", [team.pk])
            return cursor.fetchone()[0]

    yield most
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER note_running ON runs_agentrun")
        cursor.execute("DROP FUNCTION note_running()")
        cursor.execute("DROP TABLE seen_running")


@pytest.mark.worker
def test_a_teams_cap_on_runs_in_flight_is_never_passed_and_held_runs_all_run(
    workers, queue, two_teams, observed_running
):
    """Alpha may have 3 runs in flight; 2 workers with 10 slots each take
    30 of its runs and 10 of Bravo's (no cap). At most 3 of Alpha's are ever
    running — and 3 are —, every run completes (the ones the cap held are
    woken as slots free), and Bravo's run beside them, more than 3 at once."""
    alpha, bravo = two_teams
    alpha.max_running = 3
    alpha.save()
    runs = [enqueue(scripted(answer("a", delay_seconds=0.3)), team=alpha) for _ in range(30)]
    runs += [enqueue(scripted(answer("b", delay_seconds=1)), team=bravo) for _ in range(10)]
    env = {**CONCURRENT, "NRLLM_WORKER_CONCURRENCY": 10, "NRLLM_LEASE_SECONDS": 10}
    workers.start(**env)
    workers.start(**env)
    ids = [run.pk for run in runs]
    wait_until(
        lambda: (
            not AgentRun.objects.filter(pk__in=ids).exclude(status=RunStatus.COMPLETED).exists()
        ),
        timeout=30,
        progress=lambda: AgentRun.objects.filter(status=RunStatus.COMPLETED).count(),
        what="every run to complete",
    )
    assert observed_running(alpha) == 3
    assert observed_running(bravo) > 3
    assert not HeldRun.objects.exists()


def test_a_wake_passes_over_a_held_run_another_transaction_has_locked(queue, two_teams):
    """Two runs held by a cap of 0; the cap is raised while another
    transaction holds the oldest's row (a stale job's claim, say). The
    reaper's wake neither waits for it (the claim waits for the team's lock
    the wake holds: a deadlock) nor drops its hold: the other run is woken
    and dispatched, the locked one stays held, and is woken by the next pass."""
    alpha, _ = two_teams
    alpha.max_running = 0
    alpha.save()
    first, second = (enqueue(scripted(answer()), team=alpha) for _ in range(2))
    for run in (first, second):
        assert transitions.claim(run.pk, "w", 30) is None
    assert HeldRun.objects.count() == 2
    alpha.max_running = 5
    alpha.save()
    with rows_locked_elsewhere(AgentRun.objects.filter(pk=first.pk)):
        reap_stale_runs()
        assert list(HeldRun.objects.values_list("run_id", flat=True)) == [first.pk]
        assert job_id_for(second.pk, 1) in run_queue(alpha.pk).get_job_ids()
    reap_stale_runs()
    assert not HeldRun.objects.exists()
    assert run_queue(alpha.pk).get_job_ids()[0] == job_id_for(first.pk, 1)


def test_a_worker_serves_a_team_queue_its_turn_order_lacks(queue):
    """Each take replaces the worker's turn order (``_ordered_queues``); a
    team queue its list of queues already holds is still added to it."""
    worker = ConcurrentWorker([run_queue()], connection=queue.connection)
    run_queue(901).enqueue("os.getcwd")
    worker.serve_team_queues()
    assert [q.name for q in worker._ordered_queues] == [run_queue().name, run_queue(901).name]
    run_queue(902).enqueue("os.getcwd")
    worker.queues.append(run_queue(902))  # as a copy performing a job once could
    worker._team_queues_seen_at = float("-inf")
    worker.serve_team_queues()
    assert run_queue(902) in worker._ordered_queues
