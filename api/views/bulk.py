"""``POST /api/runs/bulk/``: requeue, restart or cancel many runs at once,
or preview it (``runs.operators.bulk``, as the admin's list does)."""

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response

from api import permissions
from api.bulk_serializers import BulkActionSerializer, BulkOutcomeSerializer
from api.views.base import BaseAPIView, errors
from runs.models import AgentRun
from runs.models.vocabulary import ActionResult
from runs.operators import bulk
from runs.operators.bulk import BULK_ACTIONS, RunResult, Tally


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
        if not previewing and not request.user.has_perm(action.permission):
            raise PermissionDenied(f"you need the permission {action.permission!r}")
        if "ids" in given:
            run_ids = list(dict.fromkeys(given["ids"]))
        else:
            matched = given["filter"]
            if bulk.too_many(matched):
                cap = bulk.MAX_RUNS
                raise ValidationError(
                    {
                        "filter": f"more than {cap} runs match; one bulk action takes at most "
                        f"{cap}: narrow the filter (created_after, created_before)"
                    }
                )
            run_ids = list(matched.order_by("-created_at").values_list("pk", flat=True))
        if previewing:
            results = _previewed(action, run_ids)
        else:
            note, seen = given.get("note", ""), given.get("seen", {})
            results = bulk.apply(action, run_ids, request.user, note, seen)
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


def _previewed(action, run_ids) -> list[RunResult]:
    """Each run's verdict, in the order asked, as a result that would be,
    with what the verdict saw of the run."""
    runs = bulk.runs_for_preview(AgentRun.objects.filter(pk__in=run_ids))
    lines = {line.run.pk: line for line in bulk.preview(action, runs)}
    results = []
    for run_id in run_ids:
        line = lines.get(run_id)
        if line is None:
            results.append(RunResult(str(run_id), ActionResult(False, "not_found", "no such run")))
            continue
        verdict = line.verdict
        result = ActionResult(verdict.allowed, verdict.code, verdict.reason)
        results.append(RunResult(str(run_id), result, str(line.seen)))
    return results
