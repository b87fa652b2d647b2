"""The runs and dead-letter lists as issue #30 asked for them on a laptop:
a row names its run by its id's head (linked, the whole id in a tooltip),
shows the prompt's start, the status with its reason, age and run time,
spend and the last error; the rarer filters folded; the search box says
what it searches; a dead letter's error whole, not cut at 20 characters.
The browser tests measure that it fits (test_browser_laptop.py)."""

import html
import re

import pytest

from runs.models import DeadLetter
from runs.operators import actions as operator_actions
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, scripted
from tests.test_console import audit_failed_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
PROMPT = (
    "Go through every incident note of the last quarter and summarise each one "
    "for the weekly report, grouped by the service it hit"
)


def row_of(content: str, agent_run) -> str:
    [row] = [row for row in re.findall(r"<tr.*?</tr>", content, re.S) if str(agent_run.pk) in row]
    return row


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split()


def test_a_runs_row_says_which_run_what_it_was_asked_where_it_stands_and_why(operator_client):
    failed = fresh(
        enqueue(
            scripted(call("search_notes", query="x"), {"error": "auth"}, tools=["search_notes"])
        )
    )
    long = fresh(enqueue(scripted(answer("ok"), prompt=PROMPT)))
    in_doubt = audit_failed_run()

    content = operator_client.get(RUNS).content.decode()

    headers = re.findall(r'<th scope="col" class="([^"]*column-[^"]*)"', content)
    columns = [re.search(r"column-(\w+)", header)[1] for header in headers]
    assert columns == [
        "run_id_shown",
        "prompt_shown",
        "status_shown",
        "submitter_shown",
        "model_shown",
        "age",
        "spend",
        "last_error",
    ]
    row = row_of(content, failed)
    assert f'<code class="run-id" title="{failed.pk}">{str(failed.pk)[:8]}</code>' in row
    assert f'href="/admin/runs/agentrun/{failed.pk}/change/' in row
    assert 'title="failed · not_retryable · auth">failed</span>' in row
    assert '<small class="run-why">not_retryable · auth</small>' in row
    assert "ProviderError: scripted auth failure" in row
    # Submitted from the command line, by nobody; the scripted provider.
    assert '<span class="run-by" title="no user: command line">-</span>' in row
    assert '<span class="model-name">scripted</span>' in row
    # Created to the second, with the zone, in the age's tooltip.
    assert re.search(r'title="created \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"', row)
    assert 'title="the last attempt ran ' in row
    long_row = row_of(content, long)
    assert f">{PROMPT[:99]}…<" in long_row and f'title="{PROMPT}"' in long_row
    assert 'status-completed" title="completed">completed</span>' in long_row
    assert 'class="run-why"' not in long_row  # "completed" twice says nothing
    assert "write in doubt" in row_of(content, in_doubt)
    # The search box says what it searches.
    assert 'id="searchbar_helptext">Searches a whole run id, words in the prompt' in content


def test_the_rarer_filters_are_folded_until_used(operator_client):
    content = operator_client.get(RUNS).content.decode()
    opened = re.findall(r'<details data-filter-title="([^"]+)" open>', content)
    folded = re.findall(r'<details data-filter-title="([^"]+)">', content)
    assert opened == ["status", "failure class", "write in doubt", "offers tool", "created at"]
    assert folded == ["termination reason", "requeue count", "lease"]
    # In use, a folded filter opens; the overview's and the bench's links
    # still filter by what the list no longer shows as a group.
    content = operator_client.get(RUNS, {"requeues": "0", "mode__exact": "queued"}).content
    assert b'<details data-filter-title="requeue count" open>' in content
    assert operator_client.get(RUNS, {"pending_effect__exact": "read_only"}).status_code == 200


def test_a_dead_letters_error_is_shown_whole_and_its_run_linked(operator, operator_client):
    agent_run = audit_failed_run()
    (dead_letter,) = DeadLetter.objects.filter(run=agent_run)
    error = f"{dead_letter.error_type}: {dead_letter.error_message}"
    assert 100 < len(error) < 240

    def row_shown() -> str:
        content = operator_client.get("/admin/runs/deadletter/").content.decode()
        return row_of(content, agent_run).replace("&#x27;", "'")

    # Its write in doubt in words (issue #47), the error whole in the tooltip.
    row = row_shown()
    assert "<strong>A write may have landed</strong>" in row
    assert f'title="{html.escape(error, quote=False)}"' in row
    assert f'<code class="run-id">{str(agent_run.pk)[:8]}</code></a> (failed)' in row
    assert "<strong>open</strong>" in row
    # Reconciled, no write is in doubt: the error itself, whole.
    assert operator_actions.reconcile(agent_run, operator, "applied", "it landed").ok
    assert f">{html.escape(error, quote=False)}<" in row_shown()
