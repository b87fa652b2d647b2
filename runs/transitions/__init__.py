"""Every guarded state change of a run, and the only writer of its status.

Each transition is one conditional UPDATE whose WHERE states what must still
be true (status, lease owner, lease token), and each reports whether it
matched. A worker that lost its run — reaped, re-claimed, cancelled, settled
by someone else — matches nothing and so changes nothing (G4–G6, G9).

The modules of this package are split by concern; import transitions from
the package. ``run_insert`` makes every new run in one INSERT;
``step_journal`` holds the PostgreSQL statements that change a run and
append its steps at once.
"""

from runs.transitions.approvals import (
    Decided,
    DecisionOutcome,
    ParkOutcome,
    WaitingCall,
    decide_approval,
    edit_approval,
    park,
    wait_for_approval,
)
from runs.transitions.common import Lease, db_time, recover_connection, steps_lost
from runs.transitions.ending import (
    CancelOutcome,
    FinishOutcome,
    cancel,
    dead_letter,
    fail_dispatch,
    finish,
    requeue_for_retry,
    settle,
)
from runs.transitions.input_waits import (
    Answered,
    AnswerOutcome,
    answer_call,
    expire_input_wait,
)
from runs.transitions.kept_leases import keep_leases
from runs.transitions.lease import (
    AUDIT_FAILED,
    ClaimedRun,
    cancel_requested,
    claim,
    hand_back,
    heartbeat,
    mark_audit_failed,
    renew_lease,
    seconds_until_due,
    standing,
    withdraw_fence,
)
from runs.transitions.operators import (
    append_operator_step,
    operator_requeue,
    operator_restart,
    record_late_write,
)
from runs.transitions.reaping import (
    Reaping,
    StaleLease,
    note_redispatch,
    reap_abandoned,
    reap_cancelled,
    reap_dead_letter,
    reap_requeue,
)
from runs.transitions.run_insert import begin_interactive, create_queued_run, create_rerun
from runs.transitions.steps import (
    NextCall,
    RecordOutcome,
    attempt_step_count,
    record_step,
    record_steps,
    skips_the_flush,
)
from runs.transitions.team_caps import teams_holding, wake_held
from runs.transitions.unused_approvals import expire_approvals

__all__ = [
    "teams_holding",
    "wake_held",
    "AUDIT_FAILED",
    "CancelOutcome",
    "ClaimedRun",
    "Decided",
    "DecisionOutcome",
    "FinishOutcome",
    "Lease",
    "NextCall",
    "ParkOutcome",
    "RecordOutcome",
    "Reaping",
    "StaleLease",
    "WaitingCall",
    "append_operator_step",
    "attempt_step_count",
    "begin_interactive",
    "cancel",
    "cancel_requested",
    "create_rerun",
    "claim",
    "create_queued_run",
    "db_time",
    "dead_letter",
    "decide_approval",
    "expire_approvals",
    "edit_approval",
    "park",
    "AnswerOutcome",
    "Answered",
    "answer_call",
    "expire_input_wait",
    "fail_dispatch",
    "finish",
    "hand_back",
    "heartbeat",
    "keep_leases",
    "mark_audit_failed",
    "note_redispatch",
    "operator_requeue",
    "operator_restart",
    "reap_abandoned",
    "reap_cancelled",
    "reap_dead_letter",
    "reap_requeue",
    "record_late_write",
    "recover_connection",
    "record_step",
    "record_steps",
    "renew_lease",
    "requeue_for_retry",
    "seconds_until_due",
    "settle",
    "skips_the_flush",
    "standing",
    "steps_lost",
    "wait_for_approval",
    "withdraw_fence",
]
