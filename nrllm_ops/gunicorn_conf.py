"""gunicorn's settings for the web app: ``gunicorn -c python:nrllm_ops.gunicorn_conf
nrllm_ops.wsgi``. Other settings come from the command line or
``GUNICORN_CMD_ARGS`` as usual.

With ``PROMETHEUS_MULTIPROC_DIR`` every web worker writes its own metric
files, which outlive it. A worker that exits normally (``--max-requests``, a
reload, a stop) folds them itself (``metrics_files.fold_at_exit``); one that
gunicorn killed (a timeout) or the OOM killer took cannot. So the master,
having reaped a worker, folds whatever it left, as RQ's worker folds its work
horses' files: the totals stay, the files go.
"""

from ground import metrics_files


def child_exit(server, worker):
    """Called by the master once it has reaped ``worker``: nothing writes to
    its files any more."""
    metrics_files.fold_exited(worker.pid, server.log.exception)
