"""The REST API's routes; the paths are part of the contract."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api.views import (
    agents,
    approvals,
    audits,
    bulk,
    completions,
    hooks,
    providers,
    reruns,
    root,
    runs,
    schedules,
    tools,
    triggers,
    usage,
    webhooks,
)

urlpatterns = [
    path("", root.ApiRoot.as_view(), name="api-root"),
    path("runs/", runs.RunListCreate.as_view(), name="api-runs"),
    # Before runs/<pk>/, whose pattern "bulk" would match.
    path("runs/bulk/", bulk.RunBulk.as_view(), name="api-runs-bulk"),
    path("runs/<str:pk>/", runs.RunDetail.as_view(), name="api-run"),
    path("runs/<str:pk>/steps/", runs.RunSteps.as_view(), name="api-run-steps"),
    path("runs/<str:pk>/cancel/", runs.RunCancel.as_view(), name="api-run-cancel"),
    path("runs/<str:pk>/requeue/", runs.RunRequeue.as_view(), name="api-run-requeue"),
    path("runs/<str:pk>/restart/", runs.RunRestart.as_view(), name="api-run-restart"),
    path(
        "runs/<str:pk>/rerun-from/<int:sequence>/",
        reruns.RunRerunFrom.as_view(),
        name="api-run-rerun-from",
    ),
    path(
        "runs/<str:pk>/webhook-deliveries/",
        webhooks.RunWebhookDeliveries.as_view(),
        name="api-run-webhook-deliveries",
    ),
    path("agents/", agents.AgentListCreate.as_view(), name="api-agents"),
    path("agents/<str:name>/", agents.AgentDetail.as_view(), name="api-agent"),
    path(
        "agents/<str:name>/versions/", agents.AgentVersionList.as_view(), name="api-agent-versions"
    ),
    path(
        "agents/<str:name>/versions/<int:number>/",
        agents.AgentVersionDetail.as_view(),
        name="api-agent-version",
    ),
    path("schedules/", schedules.ScheduleListCreate.as_view(), name="api-schedules"),
    path("schedules/<int:pk>/", schedules.ScheduleDetail.as_view(), name="api-schedule"),
    path("schedules/<int:pk>/pause/", schedules.SchedulePause.as_view(), name="api-schedule-pause"),
    path(
        "schedules/<int:pk>/resume/",
        schedules.ScheduleResume.as_view(),
        name="api-schedule-resume",
    ),
    path(
        "schedules/<int:pk>/backfill/",
        schedules.ScheduleBackfill.as_view(),
        name="api-schedule-backfill",
    ),
    path("triggers/", triggers.TriggerListCreate.as_view(), name="api-triggers"),
    path("triggers/<int:pk>/", triggers.TriggerDetail.as_view(), name="api-trigger"),
    # Signed by the sender, not logged in: the signature authenticates (G23).
    path("hooks/<str:path>/", hooks.Hook.as_view(), name="api-hook"),
    path("approvals/", approvals.ApprovalList.as_view(), name="api-approvals"),
    path("approvals/<str:pk>/", approvals.ApprovalDetail.as_view(), name="api-approval"),
    path(
        "approvals/<str:pk>/approve/",
        approvals.ApprovalApprove.as_view(),
        name="api-approval-approve",
    ),
    path("approvals/<str:pk>/deny/", approvals.ApprovalDeny.as_view(), name="api-approval-deny"),
    path("approvals/<str:pk>/edit/", approvals.ApprovalEdit.as_view(), name="api-approval-edit"),
    path(
        "approvals/<str:pk>/answer/",
        approvals.ApprovalAnswer.as_view(),
        name="api-approval-answer",
    ),
    # Signed for the call, not logged in: the signature authenticates (G24).
    path(
        "completions/<str:key>/<str:signature>/",
        completions.Completion.as_view(),
        name="api-completion",
    ),
    path("dead-letters/", audits.DeadLetterList.as_view(), name="api-dead-letters"),
    path("write-audits/", audits.WriteAuditList.as_view(), name="api-write-audits"),
    path(
        "write-audits/<str:pk>/reconcile/",
        audits.WriteAuditReconcile.as_view(),
        name="api-write-audit-reconcile",
    ),
    path("providers/", providers.ProviderList.as_view(), name="api-providers"),
    path("tools/", tools.ToolList.as_view(), name="api-tools"),
    path("usage/", usage.UsageList.as_view(), name="api-usage"),
    path("tools/<str:name>/", tools.ToolDetail.as_view(), name="api-tool"),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[]), name="api-schema"),
    path(
        "docs/",
        SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[]),
        name="api-docs",
    ),
]
