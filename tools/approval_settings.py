"""Setting a tool's approval policy (G14): one function for the admin and the API.

Requiring approval (``required``), or going back to the default, needs
``tools.change_toolsetting``. A relaxation — ``not_required`` where the
tool's effect and ``NRLLM_APPROVAL_REQUIRED_FOR`` ask for approval — needs
``tools.relax_approval`` as well. Both are checked here, whatever the caller
checked, so a crafted request without them changes nothing. Every change is
in the admin log, in the transaction that makes it: no change without its
entry. The effect stays code (G1): it is read from the registry, never set.
"""

from dataclasses import dataclass

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models.functions import Now

from ground.commits import reaching_disk
from teams import access
from tools.approval_policy import (
    RELAX_PERMISSION,
    ApprovalPolicy,
    is_relaxation,
    required_by_default,
    requires_approval,
)
from tools.canonical import storable_text
from tools.effects import ToolEffect
from tools.models import ToolSetting
from tools.registry import effect_for, get_registry

CHANGE_PERMISSION = "tools.change_toolsetting"
#: Longer notes are refused, not cut: the log keeps what the operator wrote.
MAX_NOTE_CHARS = 2000
VIA_ADMIN = "in the admin"
VIA_API = "through the API"


@dataclass(frozen=True)
class PolicyChange:
    """What ``set_approval_policy`` did, or why it refused."""

    ok: bool
    #: ``changed`` / ``unchanged``, or the refusal: ``invalid``,
    #: ``permission_denied``, ``relax_permission_required``, ``not_found``.
    code: str
    detail: str


def describe_policy(effect: ToolEffect, policy: str) -> str:
    """The effective policy in words, and where it comes from:
    ``required (the default for non_idempotent_write)``."""
    word = "required" if requires_approval(effect, policy) else "not required"
    if policy == ApprovalPolicy.DEFAULT:
        return f"{word} (the default for {effect.value})"
    default = "required" if required_by_default(effect) else "not required"
    if is_relaxation(effect, policy):
        return (
            f"not required: its writes run unattended (set by an operator; "
            f"the default for {effect.value} is {default})"
        )
    return f"{word} (set by an operator; the default for {effect.value} is {default})"


def policy_refusal(effect: ToolEffect, operator, policy, *, current: str) -> PolicyChange | None:
    """Why ``operator`` may not set a tool of ``effect`` whose policy is
    ``current`` to ``policy`` (None: they may). Keeping a relaxation that
    is already in place is no relaxation: nothing changes."""
    if policy not in ApprovalPolicy.values:
        return PolicyChange(
            False, "invalid", f"approval must be one of {ApprovalPolicy.values}, not {policy!r}"
        )
    # Through teams.access: an API token's narrowing holds here too (a
    # token narrowed to a team changes nothing of the deployment's).
    if not access.may_somewhere(operator, CHANGE_PERMISSION):
        return PolicyChange(
            False, "permission_denied", f"you need the permission {CHANGE_PERMISSION!r}"
        )
    if (
        policy != current
        and is_relaxation(effect, policy)
        and not access.may_somewhere(operator, RELAX_PERMISSION)
    ):
        return PolicyChange(
            False,
            "relax_permission_required",
            f"letting a {effect.value} tool run without approval whatever the default "
            f"(now NRLLM_APPROVAL_REQUIRED_FOR={settings.NRLLM_APPROVAL_REQUIRED_FOR}) "
            f"needs the permission {RELAX_PERMISSION!r}",
        )
    return None


def note_problem(note) -> str | None:
    """Why ``note`` cannot go into the log (None: it can)."""
    if not isinstance(note, str):
        return "must be a string"
    if len(note) > MAX_NOTE_CHARS:
        return f"is longer than {MAX_NOTE_CHARS} characters"
    if storable_text(note) != note:
        return "contains a character that cannot be stored (NUL or a lone surrogate)"
    return None


def set_approval_policy(
    setting: ToolSetting, operator, policy: str, note: str = "", *, via: str = VIA_ADMIN
) -> PolicyChange:
    """Set ``setting``'s approval to ``policy`` as ``operator``, with an admin
    log entry saying what it means (``note`` in it), or refuse and change
    nothing. ``setting.approval`` holds the value as the change left it.

    Raises DatabaseError if the database refuses the change or its entry
    (then neither happened). Joins the caller's transaction, if any, so a
    caller's other changes commit with it or not at all."""
    problem = note_problem(note)
    if problem:
        return PolicyChange(False, "invalid", f"note {problem}")
    effect = effect_for(setting.name)  # a tool no longer registered fails closed (G1)
    tool = get_registry().get(setting.name)
    if policy == ApprovalPolicy.REQUIRED and getattr(tool, "never_needs_approval", False):
        return PolicyChange(
            False,
            "invalid",
            f"{setting.name!r} never waits for an approval: a person answers its calls "
            "already (G24)",
        )
    with reaching_disk():
        # Locked, so the check and the log's "before" see the value this
        # change replaces, not one a concurrent change already replaced.
        current = (
            ToolSetting.objects.select_for_update()
            .filter(pk=setting.pk)
            .values_list("approval", flat=True)
            .first()
        )
        if current is None:
            return PolicyChange(False, "not_found", f"no tool {setting.name!r}")
        refused = policy_refusal(effect, operator, policy, current=current)
        if refused is not None:
            return refused
        ToolSetting.objects.filter(pk=setting.pk).update(approval=policy, updated_at=Now())
        message = _change_message(setting.name, effect, current, policy, note, via)
        LogEntry.objects.log_actions(
            operator.pk, [setting], CHANGE, change_message=message, single_object=True
        )
    setting.approval = policy
    return PolicyChange(True, "changed" if current != policy else "unchanged", message)


def _change_message(
    name: str, effect: ToolEffect, before: str, after: str, note: str, via: str
) -> str:
    if before == after:
        text = f"No change to approval {via} (stays {after})."
    else:
        text = f"Changed approval {via}: {before} → {after}."
        was, now = requires_approval(effect, before), requires_approval(effect, after)
        if was and not now:
            what = "writes" if effect.is_write else "calls"
            text += (
                f" {name} ({effect.value}) now runs its {what} unattended: "
                "no operator approves them."
            )
        elif now and not was:
            text += f" Every call of {name} now waits for an operator's approval."
    return f"{text} Note: {note}" if note else text
