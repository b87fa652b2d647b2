"""Whether a run's failure would meet a requeue again (issue #30).

A requeue or restart may be safe (G10) and still pointless: a provider that
refused the key refuses it again, a configuration error is still there, a
request the provider rejects as malformed is rejected again. The admin asks
an operator to confirm such a requeue, with this warning; it refuses
nothing — the operator may have fixed the cause (rotated the key) — and the
API, whose callers decide for themselves, does not ask.

The retryable classes (G8) are not lasting: the run was retried for them
until its budget ran out. ``unknown`` is not either: nothing says it
would come again (an audit that failed, G3, is ``unknown``, and its
requeue after a reconciliation is the designed way on).
"""

from runs.models import AgentRun
from runs.models.vocabulary import FailureClass

#: Failure classes a requeue meets again unless someone changed the cause.
LASTING = {
    FailureClass.AUTH: "the provider refused the credentials",
    FailureClass.CONFIGURATION: "the configuration is wrong",
    FailureClass.CLIENT_ERROR: "the provider refused the request as malformed",
}


def lasting_failure(run: AgentRun) -> str:
    """Why running ``run`` again would likely fail the same way ("": no reason
    to think so)."""
    cause = LASTING.get(run.failure_class)
    if cause is None:
        return ""
    return (
        f"it failed with {run.failure_class} ({cause}): a requeue or restart meets the same "
        "failure unless that was fixed first (a key rotated, a setting corrected)"
    )
