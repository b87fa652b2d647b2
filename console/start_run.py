"""Start a run from the console: a form that builds the same request
``POST /api/runs/`` takes and hands it to the same ``enqueue``, so the same
checks refuse it with the same words and nothing is stored when they do.
Picking an agent starts a run of its latest version with the prompt as its
input (``{"agent": ..., "input": ...}``); the tools, provider and
instructions then come from the agent, and the limits may only lower its.
The operator who submits it is the run's submitter: their budget applies,
and they may not approve its writes where four eyes are required.

A refusal is shown beside the field it names (the request's field, as the
API names it: ``max_cost: "two" is not an amount …``), values in JSON.
``?from=<run id>`` fills the form with that run's request ("run again" on
a run's page): its agent and input when an agent started it.
``?agent=<name>`` ("Start a run" on an agent's page) chooses that agent."""

import json

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from agents.models import Agent
from agents.starting import StartForbidden, enqueue
from runs.models import AgentRun
from runs.models.vocabulary import SubmittedVia
from runs.providers import PROVIDER_KINDS
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from spend.models import ModelPrice
from teams import access
from teams.models import Team
from tools.approval_policy import ApprovalPolicy, requires_approval
from tools.enabled import approval_overrides, disabled_tool_names
from tools.registry import effect_for, get_registry

START_RUNS = "runs.add_agentrun"
VIEW_RUNS = "runs.view_agentrun"
#: Shown under the scripted turns: a turn that calls a tool, then the
#: answer; a turn a line.
TURNS_EXAMPLE = "[\n  {}\n]".format(
    ",\n  ".join(
        json.dumps(turn)
        for turn in (
            {"tool_calls": [{"name": "search_notes", "arguments": {"query": "disk"}}]},
            {"content": "No incident mentions the disk."},
        )
    )
)


def parsed_json(text: str):
    """A field's ``text`` read as JSON, or a ValidationError saying why it is not."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise forms.ValidationError(f"not JSON: {error}") from None
    except RecursionError:
        raise forms.ValidationError("not JSON that can be read: nested too deeply") from None


class StartRunForm(forms.Form):
    agent = forms.ChoiceField(
        required=False,
        help_text="an agent's latest version: its instructions, tools and provider "
        "(the fields below them are then not used)",
    )
    team = forms.ChoiceField(
        required=False,
        help_text="the team the run belongs to, among those you may start runs in (without "
        "an agent: an agent's run is its team's)",
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
    require_approval = forms.MultipleChoiceField(
        required=False,
        label="Wait for approval of",
        widget=forms.CheckboxSelectMultiple,
        help_text="tools among those offered whose calls wait for an operator's approval "
        "although their policy does not ask it (more approvals, never fewer)",
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
        help_text="for the scripted provider: the model's answers, in order, as a JSON list "
        "— a turn that calls tools, then one that answers (the example below)",
    )
    max_iterations = forms.IntegerField(required=False, min_value=1)
    max_total_tokens = forms.IntegerField(required=False, min_value=1)
    max_cost = forms.CharField(required=False, max_length=40, help_text='e.g. "2.50"')

    def __init__(self, user, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The agents and teams ``user`` may start runs in (G22): a runner's.
        agents = access.scoped(Agent.objects.filter(latest__isnull=False), user, START_RUNS)
        self.fields["agent"].choices = [("", "— none: the request below —")] + [
            (name, name) for name in agents.order_by("name").values_list("name", flat=True)
        ]
        startable = access.scoped(Team.objects.all(), user, START_RUNS)
        teams = list(startable.values_list("slug", flat=True))
        self.fields["team"].choices = [("", "— choose a team —")] * (len(teams) != 1) + [
            (slug, slug) for slug in teams
        ]
        if len(teams) == 1:
            self.initial.setdefault("team", teams[0])
        choices = tool_choices()
        self.fields["tools"].choices = [(tool.name, tool.label) for tool in choices]
        self.fields["require_approval"].choices = [(tool.name, tool.name) for tool in choices]
        configured = [
            kind for kind, cls in PROVIDER_KINDS.items() if cls.configuration_problem() is None
        ]
        # The real provider first: scripted is for demos and tests.
        configured.sort(key=lambda kind: kind == "scripted")
        self.fields["provider"].choices = [(kind, kind) for kind in configured]
        self.fields["max_iterations"].help_text = f"at most {settings.NRLLM_MAX_ITERATIONS}"

    def clean_turns(self):
        text = self.cleaned_data["turns"].strip()
        return parsed_json(text) if text else None

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
        if data["team"]:
            request["team"] = data["team"]
        if data["instructions"]:
            request["instructions"] = data["instructions"]
        if data["require_approval"]:
            request["require_approval"] = data["require_approval"]
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
        form.add_error(field_named(str(error)), str(error))
    except StartForbidden as forbidden:
        # Names the team and the role it takes (G22).
        form.add_error("agent" if form.cleaned_data["agent"] else "team", str(forbidden))
    except BudgetRefused as refused:
        form.add_error(None, str(refused))
    return None


#: The request's fields (a refusal's first words) and the form's that set them.
FIELD_OF_REQUEST = {
    "prompt": "prompt",
    "input": "prompt",
    "instructions": "instructions",
    "tools": "tools",
    "require_approval": "require_approval",
    "max_iterations": "max_iterations",
    "max_total_tokens": "max_total_tokens",
    "max_cost": "max_cost",
    "agent": "agent",
    "version": "agent",
    "team": "team",
}


def field_named(message: str) -> str | None:
    """The form's field a refusal names ("max_cost: …", "provider/turns/0:
    …"); None (the form's own errors) when it names none of them."""
    head, _, rest = message.partition(":")
    where = head.split("/")
    if where[0] == "provider":
        if where[1:2] == ["turns"] or (len(where) == 1 and '"turns"' in rest):
            return "turns"
        return "model" if where[1:2] == ["model"] else "provider"
    return FIELD_OF_REQUEST.get(where[0])


def initial_from(run: AgentRun) -> dict:
    """The form's fields as ``run``'s request set them: its agent and input
    when it was started from an agent (its latest version then runs)."""
    if run.agent_version_id is not None:
        return {"agent": run.agent_version.agent.name, "prompt": run.prompt}
    request = run.request if isinstance(run.request, dict) else {}
    provider = request.get("provider") if isinstance(request.get("provider"), dict) else {}
    initial = {
        name: request[name]
        for name in (
            "prompt",
            "instructions",
            "tools",
            "require_approval",
            "max_iterations",
            "max_total_tokens",
            "max_cost",
        )
        if name in request
    }
    initial["team"] = run.team.slug
    initial["provider"] = provider.get("kind", "")
    initial["model"] = provider.get("model", "")
    if "turns" in provider:
        initial["turns"] = json.dumps(provider["turns"], ensure_ascii=False)
    return initial


def run_to_repeat(model_admin, request) -> tuple[AgentRun | None, str]:
    """The run ``?from=`` names, if the user may see it; else why not."""
    run_id = request.GET.get("from")
    if not run_id:
        return None, ""
    # Another team's run is as one that does not exist (G22).
    visible = access.scoped(AgentRun.objects, request.user, VIEW_RUNS)
    try:
        run = visible.select_related("agent_version__agent", "team").get(pk=run_id)
    except (AgentRun.DoesNotExist, ValidationError):
        return None, "There is no run with that id to run again: the form is empty."
    return run, ""


def agent_chosen(request) -> dict:
    """The form's agent as ``?agent=`` names it (an unknown name chooses none)."""
    name = request.GET.get("agent", "")
    return {"agent": name} if name else {}


def start_run_page(model_admin, request):
    """The form's page; a run it starts takes the operator to the run's page."""
    if not request.user.has_perm("runs.add_agentrun"):
        raise PermissionDenied
    repeated, not_repeated = run_to_repeat(model_admin, request)
    initial = initial_from(repeated) if repeated else agent_chosen(request)
    form = StartRunForm(request.user, request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        started = start_run(form, request.user)
        if started is not None:
            if not access.may(request.user, VIEW_RUNS, started.team_id):
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
            "repeated": repeated,
            "not_repeated": not_repeated,
            "turns_example": TURNS_EXAMPLE,
        },
    )
