"""Whether the database can keep what the runtime asks it to keep (G6, G12).

The records that stamp or clear a write's fence, settle, park or decide set
``synchronous_commit = on`` for their own transaction
(``ground.commits.reaching_disk``): a database or role tuned to ``off``,
or a session setting leaked through a transaction pooler, cannot make them
commits a crash may lose. What no statement can set is the server's
``fsync``: with it off, no commit reaches disk, and a server crash may lose
any of them. ``/readyz`` and the worker's start say so.
"""

import logging

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from ground.commits import FLUSH_ON_COMMIT

logger = logging.getLogger(__name__)

#: The setting that lets a deployment run on such a database all the same.
ALLOWANCE = "NRLLM_ALLOW_NON_DURABLE_DATABASE"


def durability_problem() -> str | None:
    """Why the database cannot make a commit durable, or None. Asks the
    server inside a transaction set as the runtime sets its own."""
    if connection.vendor != "postgresql":
        return None  # SQLite (the embedded default) commits to its file
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(FLUSH_ON_COMMIT)
        cursor.execute("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
        fsync, synchronous_commit = cursor.fetchone()
    if fsync != "on":
        return (
            "the PostgreSQL server runs with fsync = off: no commit reaches disk, so a "
            "server crash can lose a write's fence, its record or a run's settle, and "
            f"a write may run twice (G6, G12). Turn fsync on, or set {ALLOWANCE}=true "
            "for a database you can lose"
        )
    if synchronous_commit == "off":
        return (
            "the PostgreSQL server ignored synchronous_commit = on for a transaction "
            "(a pooler rewriting SET?): the records that must reach disk would not wait "
            f"for it (G6, G12). Set {ALLOWANCE}=true only for a database you can lose"
        )
    return None


def refusal() -> str | None:
    """``durability_problem``, unless the deployment allowed it (then it is
    logged, once per call, and None). A database that cannot be asked yet
    is no refusal: a worker starts and waits for it as it always has, and
    ``/readyz`` asks again."""
    try:
        problem = durability_problem()
    except DatabaseError as error:
        logger.warning("could not ask the database whether it keeps its commits: %s", error)
        return None
    if problem is not None and getattr(settings, ALLOWANCE):
        logger.warning("non-durable database allowed by %s: %s", ALLOWANCE, problem)
        return None
    return problem
