"""A pass, recorded in ``runs.liveness.LastPass``: the console's only sign
that the reaper (or the embedded worker, whose passes are the reaper's) is
alive. Off every run's path, at the end of a pass: one UPDATE of one row
when the row is older than ``WRITE_EVERY_SECONDS``; otherwise that UPDATE
and an INSERT that conflicts, neither writing anything."""

import os
import socket
from dataclasses import dataclass

from runs.liveness import WRITE_EVERY_SECONDS, LastPass
from runs.transitions import db_time


@dataclass(frozen=True)
class Beat:
    """Which row a pass is recorded in, and how often its process passes."""

    name: str
    every_seconds: float


def record_pass(beat: Beat) -> None:
    """Record a pass now (the database's now). The row is rewritten only if
    older than ``WRITE_EVERY_SECONDS``; the first pass ever inserts it (two
    passes racing to: one wins, both fine)."""
    at, older = db_time(), db_time(-WRITE_EVERY_SECONDS)
    # Read when the pass is made: a forking worker's job runs in a child.
    fields = {
        "at": at,
        "process": f"{socket.gethostname()}:{os.getpid()}",
        "every_seconds": beat.every_seconds,
    }
    if LastPass.objects.filter(name=beat.name, at__lt=older).update(**fields):
        return
    LastPass.objects.bulk_create([LastPass(name=beat.name, **fields)], ignore_conflicts=True)
