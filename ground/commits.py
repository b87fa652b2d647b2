"""Commits that must reach disk, whatever the database's defaults (G6, G12).

PostgreSQL's ``synchronous_commit`` decides whether a commit waits for its
WAL to be flushed. A database or role tuned to ``off``, or a session's
setting leaked through a transaction pooler, would make a commit that the
runtime counts on — a fence, a settle, an operator's decision, a tool
switched off — one a server crash may lose. ``reaching_disk`` sets it ``on``
for one transaction, as the records that may skip the flush set ``off`` for
theirs (``runs/transitions/step_journal.py``). Here, below runs, tools and the API,
so that each of them can use it.
"""

import contextlib

from django.db import connection, transaction

#: The SQL that makes the transaction it runs in commit only once its WAL is
#: on disk, whatever the session's, role's or database's default.
FLUSH_ON_COMMIT = "SET LOCAL synchronous_commit = on"


@contextlib.contextmanager
def reaching_disk():
    """A transaction whose commit waits for the WAL flush. Inside a caller's
    transaction it makes the caller's commit wait too: never less safe.
    Also a decorator."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(FLUSH_ON_COMMIT)
        yield
