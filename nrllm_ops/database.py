"""The ``DATABASES["default"]`` entry, built from a database URL.

The app's settings and the test settings both build theirs here, so the
suite runs on the connection options production uses.
"""

import dj_database_url
from django.core.exceptions import ImproperlyConfigured


def database_from_url(url: str, *, conn_max_age: int, prepared_statements: bool) -> dict:
    """Raises ``ImproperlyConfigured`` naming DATABASE_URL if ``url`` is not usable."""
    try:
        database = dj_database_url.parse(
            url,
            # Seconds a connection is kept between requests and jobs (Django's
            # CONN_MAX_AGE). A request health-checks it before reuse; a job
            # does not, its claim is the check (runs/jobs.py).
            conn_max_age=conn_max_age,
            conn_health_checks=True,
        )
    except ValueError as error:
        raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {error}") from None
    options = database.setdefault("OPTIONS", {})
    if database["ENGINE"] == "django.db.backends.postgresql" and prepared_statements:
        # Server-side binding lets psycopg prepare a statement the fifth time
        # a connection runs it (psycopg's default threshold): the server then
        # skips parsing and planning the runtime's hot statements, which was
        # about 40% of their time. Django leaves it off for connection
        # poolers that cannot keep prepared statements (PgBouncer's
        # transaction mode before 1.21); so does
        # DATABASE_PREPARED_STATEMENTS=false.
        options.update(server_side_binding=True, prepare_threshold=5)
    if database["ENGINE"] == "django.db.backends.sqlite3":
        # The embedded default has two writing processes (the web server,
        # executing new runs in its request threads, and
        # ``manage.py embedded_worker``). Three settings keep them from
        # failing each other with "database is locked":
        # - timeout: a writer waits up to 20 s for the other one's commit;
        # - IMMEDIATE: a transaction takes the write lock at BEGIN. A
        #   deferred one that reads first (appending a step reads the step
        #   count) and then writes gets "locked" at once, without waiting, when
        #   the other process writes meanwhile (two processes doing that for
        #   4 s: one committed nothing, every attempt refused at once; with
        #   IMMEDIATE no attempt was refused);
        # - WAL: readers (the admin's pages) neither wait for the writer's
        #   commit nor block it: a reader's p99 under two busy writers went
        #   from 3.6 ms to 0.13 ms (max 54 ms to 4 ms). synchronous stays FULL:
        #   a commit the runtime waited for (a write's fence) survives a crash.
        options["timeout"] = 20
        options["transaction_mode"] = "IMMEDIATE"
        options["init_command"] = "PRAGMA journal_mode=WAL"
    return database
