"""What an operator's action answers, whichever action it was.

Operator actions (``runs.operators.actions``) and approval decisions
(``runs.approvals.actions``) answer in this one shape: the admin shows its
``detail`` as a message, the API maps ``ok`` to 200 or 409 with ``code`` in
the body. It sits below both so that neither imports the other.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    #: Machine-readable, for the API's 409 body: the verdict's code, or
    #: ``changed`` / ``not_cancellable`` / ``nothing_to_reconcile`` / ...
    code: str
    detail: str
