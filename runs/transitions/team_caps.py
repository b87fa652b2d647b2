"""Waking the runs a team's cap on runs in flight held back (G22).

The cap itself is the database's (``runs/migrations/_team_cap.py``): a
claim past it matches nothing and holds the run (``runs.models.HeldRun``).
Waking takes the same lock as the claims of the team, then counts: a run
whose hold commits just after a slot frees is seen here, not left waiting.
A wake may dispatch more runs than end up claimed (two wakes count the
same free slot before either's run is claimed): the cap refuses the extra
claim and holds the run again, so the cap is never passed either way.
"""

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Subquery

from runs.models import AgentRun, HeldRun
from runs.models.team_caps import CAP_LOCK_CLASS, cap_lock_key
from runs.models.vocabulary import RunStatus
from runs.transitions.common import log_change, update_returning
from teams.models import Team

#: Held runs woken at most in one go (a team whose cap was lifted has all
#: of its held runs woken, a batch per reaper pass).
WAKE_BATCH = 500


def wake_held(team_id: int) -> list[tuple[str, int, int]]:
    """Take as many of the team's held runs off hold, oldest first, as its
    cap has room for now; returns (run_id, dispatch_count, team_id) of each,
    oldest first, to be dispatched once this has committed. Each gets a new
    dispatch number, as a redispatched run does: its job is a new one."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)", [CAP_LOCK_CLASS, cap_lock_key(team_id)]
                )
        held = HeldRun.objects.filter(team_id=team_id)
        # Cancelled, or claimed by a job of its own since: no longer held.
        held.exclude(run__status=RunStatus.QUEUED).delete()
        cap = Team.objects.filter(pk=team_id).values_list("max_running", flat=True).first()
        room = WAKE_BATCH
        if cap is not None:
            running = AgentRun.objects.filter(team_id=team_id, status=RunStatus.RUNNING).count()
            room = min(room, cap - running)
        if room <= 0:
            return []
        hold = held.filter(run=OuterRef("pk"))
        # Locked, skipping a run a claim has locked right now (a stale job
        # of its own, an operator's cancel): that one is the claim's, and
        # waiting for its row under the team's lock, which the claim's
        # trigger waits for, would deadlock. The next held run takes its turn.
        oldest = list(
            AgentRun.objects.filter(Exists(hold), status=RunStatus.QUEUED)
            .annotate(held_at=Subquery(hold.values("held_at")))
            .order_by("held_at")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("pk", flat=True)[:room]
        )
        if not oldest:
            return []
        HeldRun.objects.filter(run_id__in=oldest).delete()
        rows = update_returning(
            AgentRun.objects.filter(pk__in=oldest),
            ("id", "dispatch_count"),
            dispatch_count=F("dispatch_count") + 1,
        )
    order = {run_id: place for place, run_id in enumerate(oldest)}
    rows.sort(key=lambda row: order[row[0]])
    for run_id, _count in rows:
        log_change("wake", run_id)
    return [(run_id, dispatch_count, team_id) for run_id, dispatch_count in rows]


def teams_holding() -> list[int]:
    """The teams with runs held back by their cap (for the reaper's pass)."""
    return list(HeldRun.objects.values_list("team_id", flat=True).distinct().order_by())
