"""A team's rules over a run's request (G22): the tools it may use, and
the approvals it adds. A team may only tighten the deployment's policy:
its ``require_approval`` joins the request's, and nothing here removes an
approval the request or the deployment asks for."""

import dataclasses

from runs.runtime.json_text import shown
from runs.runtime.run_request import InvalidRunRequest, RunRequest


def under_team_rules(run_request: RunRequest, team) -> RunRequest:
    """``run_request`` as ``team`` lets it run: refused (``InvalidRunRequest``
    naming ``tools``) when it offers a tool the team may not use, as an
    unavailable tool is; else with the team's approvals added for the
    tools it offers. ``team`` None: the request as it is."""
    if team is None:
        return run_request
    refused = [name for name in run_request.tools if not team.may_use(name)]
    if refused:
        raise InvalidRunRequest(
            f"tools: not available to team {shown(team.slug)}: {shown(refused)}"
        )
    added = [
        name
        for name in run_request.tools
        if name in (team.require_approval or []) and name not in run_request.require_approval
    ]
    if not added:
        return run_request
    return dataclasses.replace(
        run_request, require_approval=(*run_request.require_approval, *added)
    )
