"""``POST /api/runs/bulk/``: requeue, restart or cancel many runs at once,
or preview it (``runs.operators.bulk``, as the admin's list does).

Scoped to the user's teams (G22) by the action's permission: a filter's
"all matching" is the runs of the teams the user may act in, and a run
named by id in another team is ``not_found``, as one that does not exist;
one the user sees but may not act on is refused ``forbidden``, naming the
role. One who may not act in any team previews as it reads a single run's
verdict: over the runs it sees, and may never apply."""

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from api import permissions, scoping
from api.bulk_serializers import BulkActionSerializer, BulkOutcomeSerializer
from api.views.base import BaseAPIView, errors
from runs.models import AgentRun
from runs.models.vocabulary import ActionResult
from runs.operators import bulk
from runs.operators.bulk import BULK_ACTIONS, RunResult, Tally
from teams import access

#: A run the user may not see: as one that does not exist (the preview's words).
NOT_FOUND = ActionResult(False, "not_found", "no such run")


class RunBulk(BaseAPIView):
    """Requeue, restart or cancel many runs (by `ids`, or all a `filter` of the runs list
    matches, at most 200): with `preview`, each run's verdict and nothing changed; without,
    each run decided again and acted on as its own action would (audited each), the
    refused ones untouched, counted by code."""

    # Viewing runs previews; doing needs the action's own permission.
    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(
        request=BulkActionSerializer,
        responses={200: BulkOutcomeSerializer, **errors(400, 413)},
        examples=[
            OpenApiExample(
                "preview a requeue of the failed runs",
                request_only=True,
                value={"action": "requeue", "filter": {"status": "failed"}, "preview": True},
            ),
            OpenApiExample(
                "cancel two runs",
                request_only=True,
                value={
                    "action": "cancel",
                    "ids": [
                        "0b9a1d8e-8a4f-4c54-9a53-0e6c1f0f3c1a",
                        "5f1c2e3d-4b5a-4c6d-8e7f-9a0b1c2d3e4f",
                    ],
                    "note": "the provider is down",
                },
            ),
        ],
    )
    def post(self, request):
        body = BulkActionSerializer(data=request.data if isinstance(request.data, dict) else None)
        body.is_valid(raise_exception=True)
        given = body.validated_data
        action = BULK_ACTIONS[given["action"]]
        previewing = given["preview"]
        user = request.user
        if not previewing and not access.may_somewhere(user, action.permission):
            raise PermissionDenied(
                f"you need the permission {action.permission!r} "
                f"(the {scoping.role_granting(action.permission)} role in a team)"
            )
        # The runs it acts on: of the teams where the action is the user's.
        reach = action.permission
        if previewing and not access.may_somewhere(user, action.permission):
            reach = scoping.VIEW_RUNS
        acting = access.scoped(AgentRun.objects.all(), user, reach)
        if "ids" in given:
            run_ids = list(dict.fromkeys(given["ids"]))
        else:
            # Scoped before it is counted: another team's runs neither fill
            # the cap nor show in the answer.
            matched = access.scoped(given["filter"], user, reach)
            if bulk.too_many(matched):
                cap = bulk.MAX_RUNS
                raise ValidationError(
                    {
                        "filter": f"more than {cap} runs match; one bulk action takes at most "
                        f"{cap}: narrow the filter (created_after, created_before)"
                    }
                )
            run_ids = list(matched.order_by("-created_at").values_list("pk", flat=True))
        refused = _out_of_reach(action, run_ids, acting, user)
        reachable = [run_id for run_id in run_ids if run_id not in refused]
        if previewing:
            done = _previewed(action, reachable)
        else:
            note, seen = given.get("note", ""), given.get("seen", {})
            done = bulk.apply(action, reachable, user, note, seen)
        # In the order asked: each run's own result, or why it was out of reach.
        by_id = {one.run_id: one for one in done}
        results = [
            by_id[str(run_id)] if run_id not in refused else refused[run_id] for run_id in run_ids
        ]
        tally = Tally.of((one.result.ok, one.result.code) for one in results)
        return Response(
            {
                "action": action.name,
                "preview": previewing,
                "runs": len(results),
                "done": tally.done,
                "refused": tally.refused_count,
                "refused_by_code": dict(tally.refused.most_common()),
                "summary": tally.says(f"will {action.name}" if previewing else action.done),
                "results": [
                    {
                        "id": one.run_id,
                        "ok": one.result.ok,
                        "code": one.result.code,
                        "detail": one.result.detail,
                        "seen": one.seen,
                    }
                    for one in results
                ],
            }
        )


def _out_of_reach(action, run_ids, acting, user) -> dict:
    """Of ``run_ids``, those outside ``acting`` (the runs the user may act
    on), each with its result: ``not_found`` for one the user may not see,
    whatever its team — the same as for one that does not exist —
    ``forbidden`` naming the role for one it sees in a team where the
    action is not its own. A run's team never changes, so what is decided
    here holds when the action is carried out."""
    in_reach = set(acting.filter(pk__in=run_ids).values_list("pk", flat=True))
    outside = [run_id for run_id in run_ids if run_id not in in_reach]
    if not outside:
        return {}
    seen = scoping.visible_runs(AgentRun.objects.filter(pk__in=outside), user)
    teams = {run.pk: run.team for run in seen.select_related("team").only("pk", "team")}
    refused = {}
    for run_id in outside:
        team = teams.get(run_id)
        if team is None:
            result = NOT_FOUND
        else:
            why = scoping.refusal(user, action.permission, team)
            result = ActionResult(False, "forbidden", why)
        refused[run_id] = RunResult(str(run_id), result)
    return refused


def _previewed(action, run_ids) -> list[RunResult]:
    """Each run's verdict, in the order asked, as a result that would be,
    with what the verdict saw of the run."""
    runs = bulk.runs_for_preview(AgentRun.objects.filter(pk__in=run_ids))
    lines = {line.run.pk: line for line in bulk.preview(action, runs)}
    results = []
    for run_id in run_ids:
        line = lines.get(run_id)
        if line is None:
            results.append(RunResult(str(run_id), NOT_FOUND))
            continue
        verdict = line.verdict
        result = ActionResult(verdict.allowed, verdict.code, verdict.reason)
        results.append(RunResult(str(run_id), result, str(line.seen)))
    return results
