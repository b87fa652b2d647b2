"""What operators may do to a run, and what they do.

``requeue_safety`` gives the verdicts (is a requeue or a restart safe, and
what would it repeat, G10); ``actions`` carries out requeue, restart,
cancel, reconcile and dismiss for the admin and the API alike, each through
a guarded transition and recorded on the run (G11); ``bulk`` previews and
applies requeue, restart or cancel on many runs, each through its
single-run action. Approve and deny are in ``runs.approvals.actions``.
"""
