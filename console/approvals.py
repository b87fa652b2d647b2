"""The approvals inbox (G14, G24): an operator page inside the admin, a
thin adapter over ``runs.approvals.actions`` and ``runs.approvals.answers``.

It lists what waits for someone outside the worker, each with what is
asked and by which run: calls waiting for approval (and edits of them
waiting for a second person), the agent's questions, and — apart, with no
action — deferred calls waiting for another system. ``?kind=`` shows one
kind, ``?run=`` one run. Its forms that take typed input (edit a call's
arguments, answer a question) are ``console.inbox_forms``'.

Seeing it needs ``runs.view_agentrun`` somewhere, and it lists the calls of
the viewer's teams only (``approval_rows.visible``); deciding needs
``runs.approve_write``, checked here (a crafted POST without it is a 403)
and again by ``runs.approvals.actions``, which judges the user's right to
the write in the run's team (G22) and four-eyes. A crafted POST naming
another team's call is answered as one naming no call; one the gate
refuses for a visible call is a 403 page naming what failed (four-eyes
aside: a message, as before teams), and the call still waits. Every
decision carries the digest of the call as the page showed it: a page left
open while the run moved on decides nothing, and says why.
"""

import logging
import uuid

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db import DatabaseError
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from console import aftermath, approval_rows
from console.display import position_in_words
from console.inbox_forms import InboxForms
from console.live import live_context
from console.paginator import BoundedCountPaginator
from runs.approvals import actions as approval_actions
from runs.models.vocabulary import WaitKind

logger = logging.getLogger(__name__)

DECIDED_PER_PAGE = 50

#: The gate's refusals a decide POST answers with a 403 page (four-eyes is
#: a message on the inbox, as it was before teams).
TEAM_REFUSALS = approval_actions.TEAM_GATE_CODES

#: The decide form's ``decision`` → what it does.
DECISIONS = {"approve": approval_actions.approve, "deny": approval_actions.deny}


class ApprovalsInbox(InboxForms):
    """Mixed into ``AgentRunAdmin``: the inbox, its decide endpoint, and its
    edit and answer forms (``InboxForms``)."""

    def approval_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("approvals/", view(self.approvals_view), name="runs_approvals"),
            path(
                "approvals/<int:approval_id>/decide/",
                view(self.decide_approval_view),
                name="runs_decide_approval",
            ),
            *self.inbox_form_urls(),
        ]

    def has_approve_permission(self, request, obj=None) -> bool:
        return request.user.has_perm(approval_actions.APPROVE_PERMISSION)

    def approvals_view(self, request):
        """Pending calls oldest first, with what led to them and a form to
        decide or answer each; the deferred calls apart; below, the decided
        ones. ``?run=<id>``: one run's; ``?kind=``: one kind's."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        user = request.user
        run_id = _run_filter(request.GET.get("run", ""))
        kind = _kind_filter(request.GET.get("kind", ""))
        for_people = [each for each in approval_rows.FOR_PEOPLE if kind in (None, each)]
        groups, pending_total = ([], 0)
        if for_people:
            groups, pending_total = approval_rows.pending_groups(user, run_id, for_people)
        deferred, deferred_total = ([], 0)
        if kind in (None, WaitKind.DEFERRED):
            deferred, deferred_total = approval_rows.deferred_rows(user, run_id)
        counts = approval_rows.pending_counts(user, run_id)
        decided = BoundedCountPaginator(approval_rows.decided(user, run_id, kind), DECIDED_PER_PAGE)
        return TemplateResponse(
            request,
            "admin/runs/approvals.html",
            {
                **self._context(request, "Approvals, questions and deferred calls"),
                "groups": groups,
                "pending_total": pending_total,
                "pending_shown": sum(len(group["calls"]) for group in groups),
                "deferred": deferred,
                "deferred_total": deferred_total,
                "kind_filter": kind,
                "kind_links": _kind_links(run_id, kind, counts),
                "decided_page": decided.get_page(request.GET.get("decided_page")),
                "decided_query": _query(run_id, kind),
                "run_filter": run_id,
                "can_approve": self.has_approve_permission(request),
                "second_person": settings.NRLLM_APPROVAL_SECOND_PERSON,
                # Live while anything waits: a decision, an answer or a
                # completion elsewhere changes what the page shows.
                **live_context(counts["all"] > 0),
            },
        )

    def decide_approval_view(self, request, approval_id):
        """POST-only: approve or deny one call, as its digest says it was
        shown; then back to the inbox (POST-redirect-GET)."""
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            back = reverse("admin:runs_approvals")
        if request.method != "POST":
            return redirect(back)
        if not (self.has_view_permission(request) and self.has_approve_permission(request)):
            raise PermissionDenied
        decision = request.POST.get("decision", "")
        if decision not in DECISIONS:
            raise BadRequest(f"decision must be one of {sorted(DECISIONS)}, not {decision!r}")
        # Another team's call is not there: the same answer as no call.
        # A question or a deferred call takes no decision: not found, as any.
        approval = (
            approval_rows.decidable(request.user)
            .filter(pk=approval_id, kind=WaitKind.APPROVAL)
            .first()
        )
        if approval is None:
            self.message_user(request, "There is no such approval request.", messages.ERROR)
            return redirect(back)
        # Not the tool's name first: the admin capitalises a message's first
        # letter, and "Send_notification" is no tool's name.
        what = (
            f"{position_in_words(approval.position).capitalize()} ({approval.tool_name}) "
            f"of run {approval.run_id}"
        )
        note = request.POST.get("note", "").strip()
        if len(note) > approval_actions.MAX_NOTE_CHARS:
            self.message_user(
                request,
                f"{what}: the note is longer than {approval_actions.MAX_NOTE_CHARS} characters; "
                "nothing was changed.",
                messages.ERROR,
            )
            return redirect(back)
        try:
            result = DECISIONS[decision](
                approval,
                request.user,
                digest=request.POST.get("digest", ""),
                note=note,
            )
        except DatabaseError:
            # The decision, its step and the release are one transaction.
            logger.exception("approval=%s %s failed on a database error", approval_id, decision)
            self.message_user(
                request,
                f"{what}: the database could not record the decision; nothing was changed.",
                messages.ERROR,
            )
        else:
            if result.code in TEAM_REFUSALS:
                # A visible call the gate refuses to this user: say which
                # condition failed; nothing was changed and the call waits.
                raise PermissionDenied(
                    f"You may not {decision} {what[0].lower()}{what[1:]} — {result.detail}. "
                    "Nothing was changed; the call still waits."
                )
            if result.ok:
                # What the decision did, and what the run did since (it may
                # have run on already, or wait for a worker): as read now.
                message = aftermath.after_decision(approval, result.detail)
                self.message_user(request, message, messages.SUCCESS)
            else:
                self.message_user(
                    request,
                    f"{what}: not {'approved' if decision == 'approve' else 'denied'}: "
                    f"{result.detail}. Nothing was changed.",
                    messages.ERROR,
                )
        return redirect(back)


def _kind_filter(value: str):
    if not value:
        return None
    if value not in WaitKind.values:
        raise BadRequest(f"kind={value!r} is not one of {WaitKind.values}")
    return WaitKind(value)


def _query(run_id, kind, **more) -> str:
    """The inbox's query string for its filters (and ``more``), "" for none."""
    parts = {"run": run_id, "kind": kind, **more}
    return urlencode({key: str(value) for key, value in parts.items() if value})


def _kind_links(run_id, selected, counts: dict) -> list[dict]:
    """The kind filter's choices: every kind and each one, with its count
    of waiting calls, the link (keeping the run filter) and which is on."""
    inbox = reverse("admin:runs_approvals")
    choices = [(None, "all", counts["all"])] + [
        (kind, words, counts[kind]) for kind, words in approval_rows.KIND_WORDS.items()
    ]
    return [
        {
            "kind": kind or "all",
            "words": words,
            "count": count,
            "url": f"{inbox}?{query}" if (query := _query(run_id, kind)) else inbox,
            "selected": kind == selected,
        }
        for kind, words, count in choices
    ]


def _run_filter(value: str):
    if not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest(f"run={value!r} is not a run id") from None
