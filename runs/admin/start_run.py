"""Start a run from the console: a form that builds the same request
``POST /api/runs/`` takes and hands it to the same ``enqueue``, so the same
checks refuse it with the same words and nothing is stored when they do.
Picking an agent starts a run of its latest version with the prompt as its
input (``{"agent": ..., "input": ...}``); the tools, provider and
instructions then come from the agent, and the limits may only lower its.
The operator who submits it is the run's submitter: their budget applies,
and they may not approve its writes where four eyes are required."""

import json

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from agents.models import Agent
from agents.starting import enqueue
from runs.providers import PROVIDER_KINDS
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from runs.vocabulary import SubmittedVia
from spend.models import ModelPrice
from tools.approval_policy import ApprovalPolicy, requires_approval
from tools.enabled import approval_overrides, disabled_tool_names
from tools.registry import effect_for, get_registry


class StartRunForm(forms.Form):
    agent = forms.ChoiceField(
        required=False,
        help_text="an agent's latest version: its instructions, tools and provider "
        "(the fields below them are then not used)",
    )
    prompt = forms.CharField(
        label="Input",
        widget=forms.Textarea(attrs={"rows": 5, "cols": 80}),
        max_length=100_000,
        help_text="what the user asks: the run's first message",
    )
    instructions = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        max_length=100_000,
        help_text="the system message, sent before the input (without an agent)",
    )
    tools = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, help_text="what the model may call"
    )
    provider = forms.ChoiceField()
    model = forms.CharField(
        required=False,
        max_length=200,
        # The page's <datalist> of priced models.
        widget=forms.TextInput(attrs={"list": "priced-models"}),
        help_text="the model the provider is asked for (priced models are suggested)",
    )
    turns = forms.CharField(
        required=False,
        label="Scripted turns (JSON)",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text='for the scripted provider: a JSON list such as [{"content": "done"}]',
    )
    max_iterations = forms.IntegerField(required=False, min_value=1)
    max_total_tokens = forms.IntegerField(required=False, min_value=1)
    max_cost = forms.CharField(required=False, max_length=40, help_text='e.g. "2.50"')

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = [("", "— none: the request below —")] + [
            (name, name)
            for name in Agent.objects.filter(latest__isnull=False).values_list("name", flat=True)
        ]
        self.fields["tools"].choices = [(tool.name, tool.label) for tool in tool_choices()]
        configured = [
            kind for kind, cls in PROVIDER_KINDS.items() if cls.configuration_problem() is None
        ]
        # The real provider first: scripted is for demos and tests.
        configured.sort(key=lambda kind: kind == "scripted")
        self.fields["provider"].choices = [(kind, kind) for kind in configured]
        self.fields["max_iterations"].help_text = f"at most {settings.NRLLM_MAX_ITERATIONS}"

    def clean_turns(self):
        text = self.cleaned_data["turns"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as error:
            raise forms.ValidationError(f"not JSON: {error}") from None
        except RecursionError:
            raise forms.ValidationError("not JSON that can be read: nested too deeply") from None

    def run_request(self) -> dict:
        """The request ``POST /api/runs/`` would take; ``enqueue`` checks it."""
        data = self.cleaned_data
        limits = {
            name: data[name]
            for name in ("max_iterations", "max_total_tokens", "max_cost")
            if data[name] not in (None, "")
        }
        if data["agent"]:
            return {"agent": data["agent"], "input": data["prompt"], **limits}
        provider = {"kind": data["provider"]}
        if data["model"]:
            provider["model"] = data["model"]
        if data["turns"] is not None:
            provider["turns"] = data["turns"]
        request = {"prompt": data["prompt"], "tools": data["tools"], "provider": provider}
        if data["instructions"]:
            request["instructions"] = data["instructions"]
        return {**request, **limits}


class ToolChoice:
    def __init__(self, name: str, effect: str, needs_approval: bool):
        self.name = name
        approval = ", waits for approval" if needs_approval else ""
        self.label = f"{name} — {effect}{approval}"


def tool_choices() -> list[ToolChoice]:
    """The registered tools an operator has not disabled, each with its
    effect and whether its calls wait for approval. Asks no MCP server."""
    disabled = disabled_tool_names()
    names = [name for name in get_registry().names() if name not in disabled]
    overrides = approval_overrides(names)
    choices = []
    for name in names:
        effect = effect_for(name)
        waits = requires_approval(effect, overrides.get(name, ApprovalPolicy.DEFAULT))
        choices.append(ToolChoice(name, effect.value, waits))
    return choices


def priced_models() -> list[str]:
    return list(ModelPrice.objects.order_by("model").values_list("model", flat=True).distinct())


def start_run(form: StartRunForm, user):
    """The run the valid ``form`` starts for ``user``, or None with the
    reason added to the form (nothing stored)."""
    try:
        return enqueue(form.run_request(), submitted_by=user, submitted_via=SubmittedVia.CONSOLE)
    except InvalidRunRequest as error:
        form.add_error(None, str(error))
    except BudgetRefused as refused:
        form.add_error(None, str(refused))
    return None


def start_run_page(model_admin, request):
    """The form's page; a run it starts takes the operator to the run's page."""
    if not request.user.has_perm("runs.add_agentrun"):
        raise PermissionDenied
    form = StartRunForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        started = start_run(form, request.user)
        if started is not None:
            if not model_admin.has_view_permission(request, started):
                # May start runs but not look at them (an integration's
                # account, say): the run's id, and the form again.
                model_admin.message_user(
                    request, f"Run {started.pk} started: it is queued.", messages.SUCCESS
                )
                return redirect(reverse("admin:runs_start"))
            model_admin.message_user(request, "Run started: it is queued.", messages.SUCCESS)
            return redirect(reverse("admin:runs_agentrun_change", args=[started.pk]))
    return TemplateResponse(
        request,
        "admin/runs/start_run.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": "Start a run",
            "opts": model_admin.model._meta,
            "form": form,
            "priced_models": priced_models(),
        },
    )
