"""The run's tables, one module per group (as zulip's ``zerver/models/``):
the run, its steps, dead letters, reconciliations and approval requests
(``run``); the provider circuits (``circuits``); the periodic processes'
last passes (``last_passes``); the run-ended webhook's outbox
(``run_events``); the runs held by their team's cap (``team_caps``).
Re-exported here, where Django and callers look for them.
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
from runs.models.team_caps import HeldRun

__all__ = [
    "EFFECT_CHOICES",
    "AgentRun",
    "ApprovalRequest",
    "CircuitTransition",
    "DeadLetter",
    "HeldRun",
    "LastPass",
    "ProviderCircuit",
    "RunEvent",
    "RunStep",
    "WriteReconciliation",
]
