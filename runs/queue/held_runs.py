"""Dispatching the runs a team's cap held back once it has room (G22).

Called where a slot may have freed: by the worker whose attempt of a
capped team's run just ended (``runs.runtime.attempt``), and by every
reaper pass for each team still holding runs (a worker killed before it
woke them, a cap raised or lifted). Woken runs go to the front of their
team's queue: they were claimed before the runs queued after them.
"""

from django.conf import settings

from runs import transitions
from runs.queue.dispatch import dispatch_many_or_fail


def wake_held_runs(team_id: int) -> int:
    """Wake and dispatch the team's held runs its cap has room for; how many.
    A dispatch that fails leaves the run ``queued`` and due, for the
    reaper's redispatch (G7), as any other."""
    woken = transitions.wake_held(team_id)
    if settings.REDIS_URL:
        # Each pushed to the front in turn: the newest first, the oldest last,
        # so the oldest is taken first.
        dispatch_many_or_fail(woken[::-1], at_front=True)
    # Without Redis a woken run is due for the embedded worker's next look;
    # executed here it would nest in the attempt that woke it.
    return len(woken)
