"""gunicorn's settings for the web app: ``gunicorn -c python:nrllm_ops.gunicorn_conf
nrllm_ops.wsgi``. Other settings come from the command line or
``GUNICORN_CMD_ARGS`` as usual.

With ``PROMETHEUS_MULTIPROC_DIR`` every web worker writes its own metric
files, which outlive it. gunicorn replaces workers (``--max-requests``, a
crash, a timeout, a reload), so without this hook the directory would gain
files with every replacement and each scrape would read them all. The master
folds an exited worker's files as RQ's worker folds its work horses'
(``nrllm_ops.metrics_files``): the totals stay, the files go.
"""

from nrllm_ops import metrics_files


def child_exit(server, worker):
    """Called by the master once it has reaped ``worker``: nothing writes to
    its files any more."""
    path = metrics_files.directory()
    if path is None:
        return
    try:
        metrics_files.fold_process(worker.pid, path)
    except OSError:
        server.log.exception("metric files of worker %s not folded", worker.pid)
