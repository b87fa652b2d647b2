"""Live pages (issue #41): the run page, the runs list, the overview and the
approvals inbox update themselves while something they show is in flight.

The page is its own fragment. ``console/static/console/live.js`` asks for the same
address again every ``NRLLM_LIVE_POLL_SECONDS`` and swaps the regions the
templates mark ``data-live-region``: the same view answers, so the same
permission checks and the same queries (none per row) stand behind every
poll. A view says whether its page is in flight with ``live_context``; a
page with nothing in flight carries no script, so a poll that gets one back
stops there.
"""

from django.conf import settings

from console.figures import LIVE


def live_context(in_flight: bool) -> dict:
    """What ``admin/runs/_live.html`` needs to make the page poll itself:
    nothing when nothing is in flight or polling is off (0 seconds)."""
    seconds = settings.NRLLM_LIVE_POLL_SECONDS
    if not (in_flight and seconds):
        return {}
    return {"live_poll_ms": max(1, round(seconds * 1000))}


def run_in_flight(run) -> bool:
    """Queued, running or waiting (for approval or input): it may still change."""
    return run.status in LIVE


class LiveRunList:
    """Mixed into ``AgentRunAdmin``: the runs list polls while a run it shows
    is in flight. Read from the rows the page shows anyway (the changelist's
    queryset, evaluated once and cached for the template): no query more."""

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        changelist = context.get("cl")
        if changelist is not None:
            context.update(live_context(any(map(run_in_flight, changelist.result_list))))
        return response
