"""Django's PostgreSQL backend, its pool opened once rather than before
every connection it lends.

Django calls ``pool.open()`` each time a thread borrows a connection. On an
open pool it does nothing, but it takes the pool's lock — the one every
thread that borrows or returns a connection takes — so with thousands of
runs in flight in a process, each borrowing and returning a connection
around every model call and tool, it was about a twentieth of the worker's
CPU (the bench's profile at 4,000 in flight) and grew with the runs
contending for it. Here an open pool is not opened again; a closed one
(never opened, or closed to be given up before a fork) is opened as
Django would.
"""

from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


class _OpenedOnce(ConnectionPool):
    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        # ``_closed`` only turns False once (under the lock, in ``open``) and
        # True for good in ``close``: read without the lock, an open pool is
        # open, and a pool closed meanwhile refuses the borrowing anyway.
        if self._closed or wait:
            super().open(wait=wait, timeout=timeout)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool = super().pool
        if type(pool) is ConnectionPool:
            # Django builds it (its options, its configure hook); only how
            # it is opened changes: the class adds no state.
            pool.__class__ = _OpenedOnce
        return pool
