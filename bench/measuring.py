"""What the figure modules share: the scripted run request the in-process
figures execute, the median round each figure reports, and the database
setting under which the figures not waiting for the flush are taken."""

import contextlib
from pathlib import Path

from django.db import connection

#: The repository: where ``manage.py`` and ``bench/dbos_peer.py`` are.
ROOT = Path(__file__).resolve().parent.parent


def steps_request(tool: str, iterations: int) -> dict:
    """A scripted run request: ``iterations - 1`` turns each calling ``tool``
    once with no arguments, then an answer."""
    turn = {"tool_calls": [{"name": tool, "arguments": {}}]}
    return {
        "prompt": "bench",
        "tools": [tool],
        "provider": {"kind": "scripted", "turns": [turn] * (iterations - 1) + [{"content": "ok"}]},
        "max_iterations": iterations,
    }


@contextlib.contextmanager
def commits_not_waiting_for_the_flush():
    """While active, every new connection to the bench database commits
    without waiting for its WAL to reach disk (``synchronous_commit = off``)
    by default: the floor's and the peer's figures then measure CPU per step,
    the limit a faster disk approaches. Ours still wait where they must (a
    write's fence and record, a settle: ``ground.commits``), whatever the
    default says — a deployment tuned this way keeps G6 and G12. Django's
    connection is reopened on the way in and out, so the setting reaches it."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    connection.close()
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
        connection.close()


def median_by(measurements: list[dict], key: str) -> dict:
    """A copy of the measurement whose ``key`` is the median (the upper one of
    an even count): the round a figure reports."""
    ordered = sorted(measurements, key=lambda m: m[key])
    return dict(ordered[len(ordered) // 2])
