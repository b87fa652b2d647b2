"""The threads a concurrent worker runs its runs in (``RunThreads``, G15):
a thread serves one run after another, so starting a run costs no thread
start; never more threads than slots; and no run inherits the connection,
or the transaction, of the run before it on the same thread.

Real PostgreSQL; the threads are the worker's own class, in this process.
"""

import threading

import pytest
from django.db import connection

from runs.workers.run_threads import RunThreads

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_thread_serves_run_after_run_each_on_a_connection_of_its_own():
    runs = RunThreads(2)
    seen = []
    together = threading.Barrier(2, timeout=5)  # two runs at once: two threads, no fewer

    def leave_a_transaction_open():
        # A run that leaves its connection mid-transaction: the next run
        # on this thread must not find itself inside it.
        with connection.cursor() as cursor:
            autocommit = connection.get_autocommit()
            connection.set_autocommit(False)
            cursor.execute("SELECT pg_backend_pid()")
            seen.append((threading.current_thread().ident, autocommit, cursor.fetchone()[0]))
        together.wait()

    for pair in range(3):
        for index in (2 * pair, 2 * pair + 1):
            assert runs.take_slot(timeout=5)
            runs.start(leave_a_transaction_open, name=f"run-{index}")
        assert runs.drain(None) == 0

    assert runs.count() == 0 and len(seen) == 6
    assert runs.threads_made == 2  # six runs, two at a time, two threads
    assert len({thread for thread, _, _ in seen}) == 2
    assert all(autocommit for _, autocommit, _ in seen)  # never in the last run's transaction
    assert len({backend for _, _, backend in seen}) == 6  # a connection each
