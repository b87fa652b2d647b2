"""The ``DATABASES["default"]`` entry, built from a database URL.

The app's settings and the test settings both build theirs here, so the
suite runs on the connection options production uses.
"""

import select

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

#: The pool a process on PostgreSQL gets when DATABASE_POOL_MAX_SIZE is not
#: set: a connection per five runs in flight of a concurrent worker at its
#: default NRLLM_WORKER_CONCURRENCY (100) — a run holds its connection only
#: for its statements, so the share falls as slots grow: the bench's
#: steady state gives 2,000 slots 40 (docs/operations.md, sizing). A web process or a SimpleWorker
#: borrows one at a time and finds it open for its next request or job; a
#: forking worker's horse opens a pool of its own (runs/worker.py).
DEFAULT_POOL_MAX_SIZE = 20


def database_from_url(
    url: str,
    *,
    conn_max_age: int,
    prepared_statements: bool,
    pool_max_size: int | None = 0,
    pool_timeout: float = 10,
) -> dict:
    """Raises ``ImproperlyConfigured`` naming DATABASE_URL if ``url`` is not
    usable, and the pool's variables if they cannot apply to it.
    ``pool_max_size=None`` (DATABASE_POOL_MAX_SIZE unset) is the default:
    ``DEFAULT_POOL_MAX_SIZE`` on PostgreSQL unless ``conn_max_age`` keeps
    connections instead (the two exclude each other), no pool on SQLite."""
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
    if pool_max_size is None:
        postgresql = database["ENGINE"] == "django.db.backends.postgresql"
        pool_max_size = DEFAULT_POOL_MAX_SIZE if postgresql and not conn_max_age else 0
    if pool_max_size:
        if database["ENGINE"] != "django.db.backends.postgresql":
            raise ImproperlyConfigured("DATABASE_POOL_MAX_SIZE needs a PostgreSQL DATABASE_URL")
        if conn_max_age:
            raise ImproperlyConfigured(
                "DATABASE_POOL_MAX_SIZE and DATABASE_CONN_MAX_AGE exclude each other: "
                "a pooled connection goes back to the pool, it is never kept"
            )
        # Django's own pool (psycopg_pool): each thread borrows a connection
        # for its statements and gives it back while it waits on a model
        # (``release_connection``), so a worker's N runs in flight share
        # ``pool_max_size`` connections. Lending one costs no round trip
        # unless the server closed it (``closed_by_the_server``). A run that
        # finds the pool exhausted for ``pool_timeout`` seconds fails as a
        # database error would: a connection failure, retryable (G8).
        # Django's backend, but a pool it has opened is not opened again
        # before every connection it lends (``ground.pooled_postgresql``).
        database["ENGINE"] = "ground.pooled_postgresql"
        options["pool"] = {
            "min_size": 1,
            "max_size": pool_max_size,
            "timeout": pool_timeout,
            "check": closed_by_the_server,
        }
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


def closed_by_the_server(pooled) -> None:
    """The pool's check as it lends ``pooled``: raises if the server closed
    it. An idle connection has nothing to read, so a readable socket means
    the server spoke unasked — it closed the connection (a restart or crash
    ends every backend), or sent a notice — and only then a round trip asks.
    Without it, after a server crash each idle connection was lent once and
    failed its first statement: the step ledger, asking after a record in
    doubt whether its steps landed, got a dead connection where an unpooled
    process reconnects (it then left its run unsettled, for the reaper).
    ``ConnectionPool.check_connection`` would pay the round trip at every
    lending, that is at every step of a concurrent worker's runs."""
    poller = select.poll()
    poller.register(pooled.fileno(), select.POLLIN)
    if poller.poll(0):
        pooled.execute("")


def release_connection() -> None:
    """Give this thread's connection back to the pool, if there is one and
    no transaction holds it: a run in flight does this before it waits on a
    model, so that a connection serves statements, not waits. Without a
    pool it keeps its connection (opening one costs more than it saves)."""
    from django.db import DatabaseError, connection

    if getattr(connection, "pool", None) is None or connection.in_atomic_block:
        return
    try:
        connection.close()
    except DatabaseError:
        pass  # the pool discards a broken connection; the next statement gets another
