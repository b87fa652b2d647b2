"""The inbox's two forms that take typed input (G24): an edit of a waiting
call's arguments, and an answer to the agent's question. Each is a page of
its own (``GET``: the form; ``POST``: the action) that the inbox also draws
inline; a POST the action refuses for its input — malformed JSON, an
argument or an answer its schema refuses, an edit that changes nothing —
shows the form again, as typed, with the error naming the field or the
path, and nothing is stored. Thin adapters over ``runs.approvals.actions.edit``
and ``runs.approvals.answers.answer``, which judge the user again.

Scoping is the inbox's: an edit may name the calls a decision may name
(``approval_rows.decidable``), an answer the questions its user sees
(``approval_rows.visible``); another team's is answered as no such call. A
refusal of the user in the run's team is a 403 page naming the condition,
as for a decision; a call that moved on since the page was shown (decided,
answered, expired, another edit) is a message on the inbox.
"""

import json
import logging
import math

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme

from console import aftermath, approval_rows
from console.display import as_text, position_in_words, shortened
from runs.approvals import actions as approval_actions
from runs.approvals import answers
from runs.models import ApprovalRequest
from runs.models.vocabulary import RunStatus, WaitKind
from tools.registry import get_registry

logger = logging.getLogger(__name__)

#: The refusals of an edit or an answer that are the form's input: the form
#: again, the error on the field. The others are the call's state (a
#: message on the inbox) or the user's (a 403 page).
EDIT_INPUT_REFUSALS = {"invalid_arguments": "arguments", "unchanged": "arguments"}
ANSWER_INPUT_REFUSALS = {"invalid_answer": "answer"}
#: The longest arguments an edit's text may be (the API's bound on a body).
MAX_ARGUMENTS_CHARS = 64_000


class _Note(forms.Form):
    note = forms.CharField(required=False, max_length=approval_actions.MAX_NOTE_CHARS, strip=True)
    # Not checked here: the action refuses a digest that is not the
    # call's as it stands (``stale_digest``), with a message that says so.
    digest = forms.CharField(widget=forms.HiddenInput, required=False)


class EditForm(_Note):
    """The call's new arguments as JSON text; parsed here, checked against
    the tool's schema by ``actions.edit``."""

    arguments = forms.CharField(widget=forms.Textarea, strip=False, max_length=MAX_ARGUMENTS_CHARS)

    def clean_arguments(self):
        return parsed_json(self.cleaned_data["arguments"], "arguments")


class AnswerForm(_Note):
    """An answer: JSON when the question gives an ``answer_schema``, plain
    text otherwise (``as_json``)."""

    answer = forms.CharField(
        widget=forms.Textarea, strip=False, max_length=answers.MAX_ANSWER_CHARS
    )

    def __init__(self, *args, as_json: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.as_json = as_json

    def clean_answer(self):
        text = self.cleaned_data["answer"]
        return parsed_json(text, "answer") if self.as_json else text.strip()


class _NotJSON(ValueError):
    pass


def _not_json(constant: str):
    raise _NotJSON(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise _NotJSON(f"{text} is too large for a JSON number")
    return number


def parsed_json(text: str, field: str):
    """``text`` as JSON, or a ValidationError naming where it is not."""
    try:
        return json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except _NotJSON as error:
        raise forms.ValidationError(
            f"{field}: not valid JSON — {error}; nothing was changed"
        ) from None
    except json.JSONDecodeError as error:
        raise forms.ValidationError(
            f"{field}: not valid JSON — {error.msg} at line {error.lineno}, "
            f"column {error.colno}; nothing was changed"
        ) from None
    except (RecursionError, ValueError) as error:
        # Nested past the parser's stack, or a number past Python's digits.
        raise forms.ValidationError(
            f"{field}: JSON that cannot be read ({type(error).__name__}); nothing was changed"
        ) from None


class InboxForms:
    """Mixed into ``ApprovalsInbox``: the edit and answer pages."""

    def inbox_form_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path(
                "approvals/<int:approval_id>/edit/",
                view(self.edit_approval_view),
                name="runs_edit_approval",
            ),
            path(
                "approvals/<int:approval_id>/answer/",
                view(self.answer_question_view),
                name="runs_answer_question",
            ),
        ]

    # --- edit ---------------------------------------------------------------------

    def edit_approval_view(self, request, approval_id):
        """The edit form of one waiting call (GET), or the edit (POST):
        back to the inbox with the edited call, or the form again with
        what is wrong with it."""
        back = _back(request)
        if not (self.has_view_permission(request) and self.has_approve_permission(request)):
            raise PermissionDenied
        approval = (
            approval_rows.decidable(request.user)
            .filter(pk=approval_id, kind=WaitKind.APPROVAL)
            .select_related("run", "run__submitted_by", "run__team", "replaces", "edited_by")
            .first()
        )
        if approval is None:
            self.message_user(request, "There is no such approval request.", messages.ERROR)
            return redirect(back)
        what = _call_words(approval)
        if request.method != "POST":
            form = EditForm(
                initial={
                    "arguments": approval_rows.editable_json(approval.arguments),
                    "digest": approval.digest,
                }
            )
            return self._edit_page(request, approval, form, back)
        form = EditForm(request.POST)
        if not form.is_valid():
            return self._edit_page(request, approval, form, back, status=400)
        try:
            result = approval_actions.edit(
                approval,
                request.user,
                digest=form.cleaned_data["digest"],
                arguments=form.cleaned_data["arguments"],
                note=form.cleaned_data["note"],
            )
        except DatabaseError:
            # The replacement, the new request and its step are one transaction.
            logger.exception("approval=%s edit failed on a database error", approval_id)
            self.message_user(
                request,
                f"{what}: the database could not record the edit; nothing was changed.",
                messages.ERROR,
            )
            return redirect(back)
        if result.code in EDIT_INPUT_REFUSALS:
            form.add_error(EDIT_INPUT_REFUSALS[result.code], f"Not saved: {result.detail}.")
            return self._edit_page(request, approval, form, back, status=400)
        if result.code in approval_actions.TEAM_GATE_CODES:
            raise PermissionDenied(
                f"You may not edit {what[0].lower()}{what[1:]} — {result.detail}. "
                "Nothing was changed; the call still waits."
            )
        if not result.ok:
            self.message_user(
                request,
                f"{what}: not edited: {result.detail}. Nothing was changed.",
                messages.ERROR,
            )
            return redirect(back)
        edited = result.made
        self.message_user(
            request,
            f"{what}: {result.detail}. It waits as request {edited.pk}, below.",
            messages.SUCCESS,
        )
        return redirect(f"{back}#approval-{edited.pk}")

    def _edit_page(self, request, approval, form, back, status=200):
        call = approval_rows.pending_call(approval, request.user)
        tool = get_registry().get(approval.tool_name)
        return TemplateResponse(
            request,
            "admin/runs/approval_edit.html",
            {
                **self._context(request, f"Edit {position_in_words(approval.position)}"),
                "call": call,
                "approval": approval,
                "form": form,
                "back": back,
                "prompt": shortened(approval.run.prompt),
                "submitter": approval_rows.submitter(approval.run),
                "parameters_json": as_text(tool.parameters) if tool is not None else "",
                "second_person": settings.NRLLM_APPROVAL_SECOND_PERSON,
            },
            status=status,
        )

    # --- answer -------------------------------------------------------------------

    def answer_question_view(self, request, approval_id):
        """The answer form of the agent's question (GET), or the answer
        (POST): back to the inbox with what the run did since, or the form
        again with what is wrong with the answer."""
        back = _back(request)
        if not (
            self.has_view_permission(request)
            and request.user.has_perm(approval_actions.RUN_PERMISSION)
        ):
            raise PermissionDenied
        question = (
            approval_rows.visible(request.user)
            .filter(pk=approval_id, kind=WaitKind.QUESTION)
            .select_related("run", "run__submitted_by", "run__team")
            .first()
        )
        if question is None:
            self.message_user(request, "There is no such question.", messages.ERROR)
            return redirect(back)
        call = approval_rows.pending_call(question, request.user)
        what = f"The question of run {question.run_id}"
        if request.method != "POST":
            form = AnswerForm(initial={"digest": question.digest}, as_json=call["answer_is_json"])
            return self._answer_page(request, question, call, form, back)
        form = AnswerForm(request.POST, as_json=call["answer_is_json"])
        if not form.is_valid():
            return self._answer_page(request, question, call, form, back, status=400)
        try:
            result = answers.answer(
                question,
                request.user,
                digest=form.cleaned_data["digest"],
                answer=form.cleaned_data["answer"],
                note=form.cleaned_data["note"],
            )
        except DatabaseError:
            logger.exception("question=%s answer failed on a database error", approval_id)
            self.message_user(
                request,
                f"{what}: the database could not record the answer; nothing was changed.",
                messages.ERROR,
            )
            return redirect(back)
        if result.code in ANSWER_INPUT_REFUSALS:
            form.add_error(ANSWER_INPUT_REFUSALS[result.code], f"Not saved: {result.detail}.")
            return self._answer_page(request, question, call, form, back, status=400)
        if result.code == "not_runner":
            raise PermissionDenied(
                f"You may not answer the question of run {question.run_id} — "
                f"{result.detail}. Nothing was changed; the run still waits."
            )
        if not result.ok:
            self.message_user(
                request,
                f"{what}: not answered: {result.detail}. Nothing was changed.",
                messages.ERROR,
            )
        else:
            self.message_user(
                request, aftermath.after_answer(question, result.detail), messages.SUCCESS
            )
        return redirect(back)

    def _answer_page(self, request, question, call, form, back, status=200):
        return TemplateResponse(
            request,
            "admin/runs/question_answer.html",
            {
                **self._context(request, "Answer the agent's question"),
                "call": call,
                "approval": question,
                "form": form,
                "back": back,
                "prompt": shortened(question.run.prompt),
                "submitter": approval_rows.submitter(question.run),
                "still_waits": question.run.status == RunStatus.WAITING_FOR_INPUT,
            },
            status=status,
        )


def _back(request) -> str:
    """Where a form goes back to: its ``next`` (this site's only), or the inbox."""
    back = request.POST.get("next", "") or request.GET.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = reverse("admin:runs_approvals")
    return back


def _call_words(approval: ApprovalRequest) -> str:
    # Not the tool's name first: the admin capitalises a message's first
    # letter, and "Send_notification" is no tool's name.
    return (
        f"{position_in_words(approval.position).capitalize()} ({approval.tool_name}) "
        f"of run {approval.run_id}"
    )
