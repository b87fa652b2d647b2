"""The overview: the admin's index page (``console.site``) for a user
who may view runs, and the approvals count in every page's header.

The index asks for the numbers (``console.overview``), the charts
(``overview_charts``), whether the reaper and the workers are alive
(``liveness``), the spend module and the provider circuits; Django's app
list stays beside them. A user who may not view runs gets Django's index,
and neither the numbers nor the header count.
"""

from django.conf import settings
from django.db.models import Count, Q
from django.urls import reverse

from console import figures as console
from console.live import live_context
from console.liveness import liveness
from console.overview_charts import charts, window_of
from console.queue_dashboard import may_see_queue
from console.spend_overview import spend_overview
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, WaitKind
from spend.budgets import database_now
from teams import access

VIEW_RUNS = "runs.view_agentrun"


def header(request) -> dict:
    """The calls waiting for approval — and the agents' questions waiting
    for an answer, the deferred calls waiting for another system (G24) —
    for the header of every page: counted once per request, in one query
    (a view that builds another's context asks ``each_context`` again; the
    index shows the same numbers), and only for a user who may view runs —
    anyone else gets nothing, not even a zero."""
    if not hasattr(request, "_nrllm_header"):
        context = {}
        user = getattr(request, "user", None)
        # Staff only: the admin's login page asks for the context too.
        if user is not None and user.is_active and user.is_staff and user.has_perm(VIEW_RUNS):
            # The calls of the runs the user sees (G22): another team's
            # waiting calls are not counted, as they are not listed.
            pending = access.scoped(ApprovalRequest.objects, user, VIEW_RUNS)
            # The partial index approval_pending_idx holds exactly these rows.
            counts = pending.filter(status=ApprovalStatus.PENDING).aggregate(
                approvals=Count("pk", filter=Q(kind=WaitKind.APPROVAL)),
                questions=Count("pk", filter=Q(kind=WaitKind.QUESTION)),
                deferred=Count("pk", filter=Q(kind=WaitKind.DEFERRED)),
            )
            inbox = reverse("admin:runs_approvals")
            context = {
                "pending_approvals": counts["approvals"],
                "pending_questions": counts["questions"],
                "pending_deferred": counts["deferred"],
                "approvals_url": inbox,
                "questions_url": f"{inbox}?kind={WaitKind.QUESTION}",
                "deferred_url": f"{inbox}?kind={WaitKind.DEFERRED}",
            }
        request._nrllm_header = context
    return request._nrllm_header


def index_context(request) -> dict:
    """The overview's modules, or nothing for a user who may not view runs."""
    if not request.user.has_perm(VIEW_RUNS):
        return {}
    now = database_now()
    user = request.user
    numbers = console.overview(now, user)
    # Every team's (platform staff): the deployment's queue and spend.
    # The spend rows carry no team yet, so a member of some teams gets no
    # spend module rather than every team's.
    deployment = access.holds_globally(user, VIEW_RUNS)
    return {
        "overview": True,
        "now": now,
        **numbers,
        # Live while a run may still change (calls waiting: their runs wait,
        # for approval or for input).
        **live_context(any(numbers[status] for status in console.LIVE)),
        "charts": charts(now, window_of(request), user),
        "liveness": liveness(now),
        "spend": spend_overview() if deployment else None,
        "can_view_spend": request.user.has_perm("spend.view_dailyspend"),
        "can_view_dead_letters": request.user.has_perm("runs.view_deadletter"),
        "queues_url": "/admin/django-rq/" if settings.REDIS_URL and may_see_queue(user) else "",
    }
