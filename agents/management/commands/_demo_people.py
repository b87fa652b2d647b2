"""The demo's people-in-the-loop stories (G24): the agent asks a person a
question and waits for the answer, and an approver edits a call whose
arguments the model got wrong, which then waits for its own approval.
``seed_demo`` executes them."""

from django.core.management.base import CommandError

from agents.management.commands._demo_requests import notifying, with_usage
from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus

#: The agent lacks a fact and asks (G24): left waiting for an answer.
ASKING = with_usage(
    {
        "prompt": "Restart the database host that is out of disk.",
        "tools": ["ask_person", "send_notification"],
        "require_approval": ["send_notification"],
        "provider": {
            "kind": "scripted",
            "turns": [
                {
                    "tool_calls": [
                        {
                            "name": "ask_person",
                            "arguments": {
                                "question": "Which host is out of disk, and may I restart it "
                                "now or only in the maintenance window?",
                                "answer_schema": {
                                    "type": "object",
                                    "properties": {
                                        "host": {"enum": ["db-1", "db-2"]},
                                        "when": {"enum": ["now", "maintenance window"]},
                                    },
                                    "required": ["host", "when"],
                                    "additionalProperties": False,
                                },
                            },
                        }
                    ]
                },
                {"content": "Restart scheduled as answered."},
            ],
        },
    }
)

#: The model names the wrong host; the demo approver edits the call, and
#: the edited call waits for its own approval (G24).
EDITED = notifying(
    "Tell on-call which database host is restarted tonight.",
    {"recipient": "oncall@example.org", "message": "Restarting db-1 tonight at 22:00 UTC."},
    "On-call knows which host is restarted.",
)
EDITED_ARGUMENTS = {
    "recipient": "oncall@example.org",
    "message": "Restarting db-2 (out of disk, incident 42) tonight at 22:00 UTC.",
}
EDITED_NOTE = "db-2 is the host out of disk, not db-1"


def edit_as_the_demo_approver(agent_run, editor) -> None:
    """Edit the call ``agent_run`` waits for, as an approver does in the inbox."""
    approval = ApprovalRequest.objects.get(run=agent_run, status=ApprovalStatus.PENDING)
    result = approval_actions.edit(
        approval, editor, digest=approval.digest, arguments=EDITED_ARGUMENTS, note=EDITED_NOTE
    )
    if not result.ok:
        raise CommandError(f"demo run {agent_run.pk}: not edited ({result.code}): {result.detail}")
