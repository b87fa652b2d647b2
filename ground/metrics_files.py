"""Prometheus' multiprocess directory, kept to a bounded number of files.

In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) prometheus-client gives
every process its own ``counter_<pid>.db`` and ``histogram_<pid>.db``, and
``/metrics`` reads every file in the directory on each scrape. Files of dead
processes are never removed: their counts still belong in the totals
(prometheus/client_python#204, #367). RQ's forking worker runs each job in a
new process, so the directory would gain two files per job, for ever, and
scrapes would grow slower with every job ever run.

So the worker folds a work horse's files into one ``<kind>_folded.db`` per
kind as soon as the horse has exited (``runs.worker.Worker``), and gunicorn's
master a web worker's once it has reaped it (``nrllm_ops.gunicorn_conf``):
values are added, the exited process's files removed. Any other process
(an rqworker itself, a ``SimpleWorker``, a management command) folds its own
as it exits normally (``fold_at_exit``). Every folded kind holds sums, so the
totals are unchanged. Folding holds an exclusive lock on the
directory and ``/metrics`` a shared one while it reads, so a scrape never
sees a value both folded and in its horse's file, or in neither.
"""

import atexit
import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from prometheus_client import multiprocess
from prometheus_client.mmap_dict import MmapedDict

#: The kinds whose values are sums: counters, histogram buckets and
#: summaries' count and sum (django-rq's collector has one). Gauges are not:
#: the per-process series of a live gauge go with its process
#: (``mark_process_dead``), and the runtime's gauges are read from the
#: database at scrape time instead.
FOLDED_KINDS = ("counter", "histogram", "summary")
_LOCK_FILE = ".nrllm-fold.lock"


def directory() -> Path | None:
    """The multiprocess directory, or None when metrics are per process."""
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(configured) if configured else None


@contextlib.contextmanager
def _locked(path: Path, operation: int):
    with open(path / _LOCK_FILE, "a") as lock:
        fcntl.flock(lock, operation)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def reading_lock(path: Path):
    """Held by a scrape while it reads the directory's files."""
    return _locked(path, fcntl.LOCK_SH)


def fold_process(pid: int, path: Path) -> None:
    """Add the exited process ``pid``'s counters and histograms to the folded
    files and remove its own. Only for a process known to have exited (its
    parent has waited for it), so nothing writes to its files any more.

    The folded file is rebuilt aside and renamed into place, then the
    process's file removed: a worker killed in between counts one horse
    twice, never loses counts or leaves a half-written file.
    """
    with _locked(path, fcntl.LOCK_EX):
        for kind in FOLDED_KINDS:
            source = path / f"{kind}_{pid}.db"
            if not source.exists():
                continue
            folded = path / f"{kind}_folded.db"
            rebuilt = path / f"{kind}_folded.db.new"  # not *.db: scrapes skip it
            if folded.exists():
                shutil.copyfile(folded, rebuilt)
            else:
                rebuilt.unlink(missing_ok=True)
            totals = MmapedDict(str(rebuilt))
            try:
                values = MmapedDict.read_all_values_from_file(str(source))
                for key, value, _timestamp, _position in values:
                    total, _ = totals.read_value(key)
                    totals.write_value(key, total + value, 0.0)
            finally:
                totals.close()
            os.replace(rebuilt, folded)
            source.unlink()
        multiprocess.mark_process_dead(pid, str(path))


def fold_exited(pid: int, log=None) -> None:
    """``fold_process`` in the configured directory, if metrics are
    multiprocess. A failure leaves ``pid``'s files, counts intact, and is
    reported to ``log`` (a logger's ``exception``) if one is given."""
    path = directory()
    if path is None:
        return
    try:
        fold_process(pid, path)
    except OSError:
        if log is not None:
            log("metric files of process %s not folded", pid)


def fold_at_exit() -> None:
    """Fold this process's own files when it exits normally.

    Only a work horse and a gunicorn web worker have a parent that folds
    them. Any other process folds itself here: an rqworker (forking or
    ``SimpleWorker``), a management command, a web worker under another
    server. By the time exit handlers run, it records nothing more. A work
    horse leaves with ``os._exit``, so this never runs there; a process
    killed by a signal leaves its files, their counts intact.
    """
    if directory() is not None:
        # The pid at exit, not now: a process forked later inherits this.
        atexit.register(lambda: fold_exited(os.getpid()))
