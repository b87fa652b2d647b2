"""The operator pages that are no model's list — the approvals inbox and
the failed write audits — as entries of the runs' app in the admin's app
list: the navigation sidebar on every page, and the index. An operator
finds them where the runs and dead letters are, not only through a button
on the runs list or a number on the overview."""

from django.urls import reverse

VIEW_RUNS = "runs.view_agentrun"

#: (name in the list, URL name, CSS name): both pages need runs.view_agentrun.
PAGES = [
    ("Approvals", "admin:runs_approvals", "approvals"),
    ("Failed write audits", "admin:runs_write_audits", "writeaudits"),
]


def operator_pages(request) -> list[dict]:
    """The pages ``request``'s user may see, as Django's app list has a
    model: a name, a URL, nothing to add."""
    if not request.user.has_perm(VIEW_RUNS):
        return []
    return [
        {
            "name": name,
            "object_name": object_name,
            "admin_url": reverse(url_name),
            "add_url": None,
            "perms": {"view": True},
            "view_only": True,
        }
        for name, url_name, object_name in PAGES
    ]
