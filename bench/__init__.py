"""``make bench``: the runtime's cost next to baselines measured in the same run.

``run`` is the runner: sizes, targets and the results table. Each figure has
its module: ``steps`` (step overhead and its psycopg floors), ``resume``,
``peer`` (next to DBOS Transact, whose side is ``dbos_peer``, a script run in
its own virtualenv), ``through_the_queue`` (rqworkers next to bare RQ jobs)
and ``scale`` (pages, reaper and claim on a large database). ``measuring``
holds what they share; ``tools`` the no-op tools and RQ jobs the figures run.
"""
