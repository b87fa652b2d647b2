"""The runs list's actions — requeue, restart, cancel — on many runs at
once: the selected runs, or all that match the list's filter (Django's
"select all"), at most ``bulk.MAX_RUNS``. A preview page lists each run's
verdict and the counts; confirmed, each run goes through its single-run
action (``runs.operators.bulk``), and one message counts what was done
and what was refused, by reason — and, after a requeue or a restart,
which of the runs sent back have already failed again. The same page asks
before a requeue from the dead letters or before one run's requeue whose
failure would come again (``console.run_actions``)."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG, IGNORED_PARAMS, PAGE_VAR
from django.http import HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from console.aftermath import run_named
from console.team_scope import role_needed
from runs.models import AgentRun
from runs.models.vocabulary import ActionResult
from runs.operators import bulk
from runs.operators.bulk import BULK_ACTIONS, BulkAction, RunResult, Seen, Tally
from teams import access

ACTION_CHECKBOX_NAME = admin.helpers.ACTION_CHECKBOX_NAME
VIEW_RUNS = "runs.view_agentrun"
#: The permission each bulk action takes, in the team of each run (G22).
ACTION_PERMISSION = {
    "requeue": "runs.requeue_agentrun",
    "restart": "runs.requeue_agentrun",
    "cancel": "runs.cancel_agentrun",
}
#: Each action, as a refusal names it.
_DOING = {"requeue": "requeueing", "restart": "restarting", "cancel": "cancelling"}
#: Where a bulk requeue or restart leaves its outcome (in the session) for
#: the runs list it redirects to: the list says it as it renders, so that
#: "already failed again" names the runs that had failed by the time the
#: operator reads the message, not by the end of the action's request.
AFTER_BULK = "nrllm_after_bulk"
#: The runs failed again that the message links, at most.
FAILED_AGAIN_SHOWN = 10

#: What the preview says each action does, above its table.
_WHAT_IT_DOES = {
    "requeue": "Each run is checked by the requeue verdict; each safe one resumes from its "
    "journal — recorded model turns and tool outcomes are replayed, never repeated — and "
    "continues live after them.",
    "restart": "Each run is checked by the restart verdict; the safe ones run again from the "
    "beginning, replaying nothing they recorded, so a run that executed a "
    "non_idempotent_write is refused.",
    "cancel": "A queued run or one waiting (for approval or input) is cancelled at once; a "
    "running one stops at its next step boundary. A run that has ended cannot be cancelled.",
}


class BulkRunActions:
    """Mixed into ``AgentRunAdmin``: the list's actions and their preview."""

    @admin.action(
        description="Requeue selected runs: resume from their journal (safe ones only)",
        permissions=["requeue"],
    )
    def requeue_selected(self, request, queryset):
        return self._bulk(request, queryset, BULK_ACTIONS["requeue"])

    @admin.action(
        description="Restart selected runs from the beginning (safe ones only)",
        permissions=["requeue"],
    )
    def restart_selected(self, request, queryset):
        return self._bulk(request, queryset, BULK_ACTIONS["restart"])

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        return self._bulk(request, queryset, BULK_ACTIONS["cancel"])

    def _bulk(self, request, queryset, action: BulkAction):
        """Unconfirmed: the preview of ``queryset`` (the selection, or every
        run the filter matches). Confirmed: the action on the runs the
        preview listed — by id, so a run that left the filter meanwhile is
        still counted — each decided again."""
        changelist = reverse("admin:runs_agentrun_changelist")
        permission = ACTION_PERMISSION[action.name]
        if request.POST.get("confirm") != "yes":
            if refused := empty_filter_refused(request, self):
                self.message_user(request, refused, messages.ERROR)
                return None
            # Of what the list shows (the teams the user sees), only the
            # runs of the teams where it may take this action (G22).
            acting = access.scoped(queryset, request.user, permission)
            if bulk.too_many(acting):
                self.message_user(request, too_many_selected(), messages.ERROR)
                return None
            runs = bulk.runs_for_preview(acting)
            left_out = left_out_count(queryset, acting, request.user, permission)
            if not runs and left_out:
                self.message_user(
                    request,
                    f"Nothing was done: {_DOING[action.name]} takes {role_needed(permission)} "
                    "in the team of each selected run.",
                    messages.ERROR,
                )
                return None
            return self.bulk_preview(
                request,
                action,
                runs,
                action_url=changelist,
                back=request.GET.urlencode(),
                left_out=left_out,
            )
        run_ids = list(dict.fromkeys(request.POST.getlist(ACTION_CHECKBOX_NAME)))
        if len(run_ids) > bulk.MAX_RUNS:
            self.message_user(request, too_many_selected(), messages.ERROR)
            return None
        results = apply_in_scope(
            action,
            run_ids,
            request.user,
            request.POST.get("note", ""),
            _seen(request, run_ids),
        )
        if len(results) == 1:
            # One run: what it did since, as its page's buttons say.
            (one,) = results
            self._say(request, one.run_id, action.name, one.result, with_run=True)
        else:
            tally = Tally.of((one.result.ok, one.result.code) for one in results)
            says = _first_up(tally.says(action.done))
            sent_back = [one.run_id for one in results if one.result.ok]
            if action.name == "cancel" or not sent_back:
                level = messages.WARNING if tally.refused else messages.SUCCESS
                self.message_user(request, f"{says}.", level)
            else:
                request.session[AFTER_BULK] = {
                    "says": says,
                    "done": action.done,
                    "refused": tally.refused_count,
                    "runs": sent_back,
                }
        back = QueryDict(request.POST.get("back", "")).urlencode()
        return HttpResponseRedirect(f"{changelist}?{back}" if back else changelist)

    def changelist_view(self, request, extra_context=None):
        # A live poll leaves it for the page the operator loads (live.py).
        if request.method == "GET" and not request.headers.get("X-Nrllm-Live"):
            after = request.session.pop(AFTER_BULK, None)
            if after:
                self._say_after_bulk(request, after)
        return super().changelist_view(request, extra_context)

    def _say_after_bulk(self, request, after: dict) -> None:
        """The message of a bulk requeue or restart, as the list renders:
        its counts, and the runs it sent back that have already failed again
        (linked, with why), read now."""
        failed = bulk.failed_again(after["runs"])
        level = messages.WARNING if after["refused"] or failed else messages.SUCCESS
        if not failed:
            self.message_user(request, f"{after['says']}.", level)
            return
        sent, shown = len(after["runs"]), failed[:FAILED_AGAIN_SHOWN]
        links = format_html_join(
            ", ",
            "{} ({})",
            (
                (run_named(run.pk, colon=False), run.failure_class or run.termination_reason)
                for run in shown
            ),
        )
        more = f" and {len(failed) - len(shown)} more" if len(failed) > len(shown) else ""
        if sent == 1:
            which = f"the run {after['done']} has"
        else:
            verb = "has" if len(failed) == 1 else "have"
            which = f"{len(failed)} of the {sent} {after['done']} {verb}"
        self.message_user(
            request,
            format_html(
                "{}. {} already failed again: {}{}.", after["says"], _first_up(which), links, more
            ),
            level,
        )

    def bulk_preview(
        self, request, action: BulkAction, runs, *, action_url, back="", back_url="", left_out=0
    ):
        """The page that asks before ``action``: each run's verdict (the
        warning where its failure would come again) and the counts.
        Confirmed, it posts ``confirm=yes``, the runs and what the preview
        saw of each to ``action_url``; after the action the list comes
        back with the query ``back``. Its Back link leads to ``back_url``
        (the runs list with ``back``)."""
        changelist = reverse("admin:runs_agentrun_changelist")
        lines = bulk.preview(action, runs)
        tally = Tally.of((line.verdict.allowed, line.verdict.code) for line in lines)
        return TemplateResponse(
            request,
            "admin/runs/agentrun/bulk_preview.html",
            {
                **self.admin_site.each_context(request),
                "title": f"{action.name.capitalize()} runs",
                "opts": self.model._meta,
                "action": action,
                "action_field": f"{action.name}_selected",
                "what_it_does": _WHAT_IT_DOES[action.name],
                "lines": lines,
                "tally": tally,
                "counts": _first_up(tally.says(f"will {action.name}")),
                "warned": any(line.warning for line in lines),
                "shows_tools": action.name != "cancel",
                "action_url": action_url,
                "back": back,
                "back_url": back_url or (f"{changelist}?{back}" if back else changelist),
                "note": request.POST.get("note", ""),
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                # Selected runs of teams where the user may not do this.
                "left_out": left_out,
                "left_out_role": role_needed(ACTION_PERMISSION[action.name]),
            },
        )


def left_out_count(queryset, acting, user, permission: str) -> int:
    """How many runs of ``queryset`` are not in ``acting`` (its runs the
    ``user`` may use ``permission`` on), counted no further than one bulk
    action takes; no query when it may act in every team it sees."""
    acts_in, sees = access.teams_with(user, permission), access.teams_with(user, VIEW_RUNS)
    if acts_in is access.EVERY or (sees is not access.EVERY and sees <= acts_in):
        return 0
    outside = queryset.order_by().exclude(pk__in=acting.order_by().values("pk"))
    return outside[: bulk.MAX_RUNS + 1].count()


def apply_in_scope(action: BulkAction, run_ids, user, note: str, seen: dict) -> list:
    """``bulk.apply`` on the runs of ``run_ids`` that ``user`` may take
    ``action`` on; each other is refused in its place, as ``not_found``
    when it is another team's (as a run deleted since), as ``forbidden``
    naming the role when the user sees it but may not act on it (G22).
    The ids were checked by the site (``console.site``): each is a run id."""
    permission = ACTION_PERMISSION[action.name]
    pk = AgentRun._meta.pk
    run_ids = [str(pk.to_python(run_id)) for run_id in run_ids]
    named = AgentRun.objects.filter(pk__in=run_ids)
    visible = {str(pk) for pk in access.scoped(named, user, VIEW_RUNS).values_list("pk", flat=True)}
    allowed = {
        str(pk) for pk in access.scoped(named, user, permission).values_list("pk", flat=True)
    }
    done = {
        one.run_id: one
        for one in bulk.apply(
            action, [run_id for run_id in run_ids if run_id in allowed], user, note, seen
        )
    }
    results = []
    for run_id in run_ids:
        if run_id in done:
            results.append(done[run_id])
        elif run_id in visible:
            refused = f"{_DOING[action.name]} takes {role_needed(permission)} in its team"
            results.append(RunResult(run_id, ActionResult(False, "forbidden", refused)))
        else:
            results.append(
                RunResult(run_id, ActionResult(False, "not_found", "no such run (deleted since?)"))
            )
    return results


def _first_up(text: str) -> str:
    """A sentence's first letter up, the rest (the codes) as they are."""
    return text[:1].upper() + text[1:]


def too_many_selected() -> str:
    return (
        f"Nothing was done: more than {bulk.MAX_RUNS} runs are selected, and one bulk action "
        f"takes at most {bulk.MAX_RUNS} (each run's verdict reads its journal). Narrow the "
        "filter (by date, say) and select again."
    )


def empty_filter_refused(request, model_admin) -> str:
    """Why "select all" may not act on what ``model_admin``'s list matches,
    or "" if it may: the list's address gives a filter no value (``?tool=``,
    say, from a link built with a value missing), or a value the filter
    does not take (``?write_in_doubt=true``, the API's word for the list's
    "yes"). A list reads either as no filter at all (or as a value no row
    has), so what "all matching" would take is not what the address asked
    for; it is refused, naming the parameter, rather than widened to every
    row. Rows ticked one by one are what the page shows, and are not
    refused."""
    if not _selects_across(request):
        return ""
    controls = {*IGNORED_PARAMS, PAGE_VAR, ERROR_FLAG}
    for name, values in request.GET.lists():
        if name not in controls and any(not value.strip() for value in values):
            return (
                f"Nothing was done: the list's address gives the filter {name!r} no value "
                f'(?{name}=), so "all matching" would not be narrowed by it. {_PICK_AGAIN}'
            )
    ignored = next(_values_ignored(request, model_admin), None)
    if ignored is None:
        return ""
    name, value = ignored
    return (
        f"Nothing was done: the list's filter {name!r} does not take the value "
        f'{value!r} (?{name}={value}), so "all matching" would not be narrowed by it. '
        f"{_PICK_AGAIN}"
    )


_PICK_AGAIN = 'Pick a value for it among the filters, or "All" to drop it, and select again.'


def _values_ignored(request, model_admin):
    """Each (parameter, value) of the address that a list filter of
    ``model_admin`` of choices (a ``SimpleListFilter``) does not take: its
    ``queryset`` reads such a value as no filter. A filter that narrows by
    any value it is given (``takes_any_value``: runs offering a tool by
    that name) is not asked."""
    params = {name: request.GET.getlist(name) for name in request.GET}
    for list_filter in model_admin.get_list_filter(request):
        if not (isinstance(list_filter, type) and issubclass(list_filter, admin.SimpleListFilter)):
            continue
        name = list_filter.parameter_name
        if name not in params or getattr(list_filter, "takes_any_value", False):
            continue
        # The filter as the list builds it (it reads the last value given).
        shown = list_filter(request, dict(params), model_admin.model, model_admin)
        if shown.value() not in {str(lookup) for lookup, _ in shown.lookup_choices}:
            yield name, shown.value()[:40]


def _selects_across(request) -> bool:
    """Whether an action was asked of every row the list matches (Django's
    "select all"), read as the admin's action form reads it."""
    return forms.BooleanField(required=False).clean(request.POST.get("select_across"))


def _seen(request, run_ids) -> dict:
    """What the preview saw of each run, as it posted it. One it cannot
    have posted is taken as changed: never as nothing to compare."""
    seen = {}
    for run_id in run_ids:
        posted = request.POST.get(f"seen-{run_id}")
        if posted is not None:
            seen[run_id] = Seen.parse(posted) or Seen("", -1)
    return seen
