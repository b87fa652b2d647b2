"""Approvals of writes (G14): a call that needs an operator's decision waits
for it, bound to the exact call by its digest.

``gate`` is what an attempt does with a turn's calls (which wait, which an
operator decided); ``actions`` are the operator's approve and deny;
``notices`` and ``webhook`` tell operators that a run waits. The runtime
uses the gate and the notices; an approval's decision releases its run
back to the queue (``runs.queue.dispatch``), never into the runtime directly.
Parking and deciding are transitions (``runs.transitions.approvals``), and so
are expiring and withdrawing (``runs.transitions.unused_approvals``).
"""
