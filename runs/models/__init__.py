"""The run's tables, one module per group (as zulip's ``zerver/models/``):
the run, its steps, dead letters, reconciliations and approval requests
(``run``); the provider circuits (``circuits``); the periodic processes'
last passes (``last_passes``); the run-ended webhook's outbox
(``run_events``). Re-exported here, where Django and callers look for them.
"""

from runs.models.circuits import CircuitTransition, ProviderCircuit
from runs.models.last_passes import LastPass
from runs.models.run import (
    EFFECT_CHOICES,
    AgentRun,
    ApprovalRequest,
    DeadLetter,
    RunStep,
    WriteReconciliation,
)
from runs.models.run_events import RunEvent

__all__ = [
    "EFFECT_CHOICES",
    "AgentRun",
    "ApprovalRequest",
    "CircuitTransition",
    "DeadLetter",
    "LastPass",
    "ProviderCircuit",
    "RunEvent",
    "RunStep",
    "WriteReconciliation",
]
