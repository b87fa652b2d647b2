"""Which tools need an operator's approval before a call runs (G14).

A tool's default follows its declared effect (code, G1) and the setting
``NRLLM_APPROVAL_REQUIRED_FOR``: ``non_idempotent_write`` (the default),
``write`` (every write) or ``none``. An operator may require approval of any
tool (``ToolSetting.approval = required``); letting a tool whose default
asks for approval run unattended (``not_required``) is a relaxation, which
needs the permission ``tools.relax_approval`` and is audited; so does
``not_required`` on any write, whatever the default is now. A run's
request may add tools (``require_approval``), never remove one.
"""

from collections.abc import Collection, Mapping

from django.conf import settings
from django.db import models

from tools.effects import ToolEffect

RELAX_PERMISSION = "tools.relax_approval"


class ApprovalPolicy(models.TextChoices):
    """An operator's approval setting for one tool (``ToolSetting.approval``)."""

    #: What the tool's effect and ``NRLLM_APPROVAL_REQUIRED_FOR`` say.
    DEFAULT = "default"
    REQUIRED = "required"
    #: Runs unattended even where the default asks for approval.
    NOT_REQUIRED = "not_required"


def required_by_default(effect: ToolEffect) -> bool:
    """Whether a tool of ``effect`` needs approval when no operator said otherwise."""
    required_for = settings.NRLLM_APPROVAL_REQUIRED_FOR
    if required_for == "write":
        return effect.is_write
    if required_for == "non_idempotent_write":
        return effect is ToolEffect.NON_IDEMPOTENT_WRITE
    return False


def requires_approval(effect: ToolEffect, policy: str) -> bool:
    """Whether a tool of ``effect`` whose setting is ``policy`` needs approval."""
    if policy == ApprovalPolicy.REQUIRED:
        return True
    if policy == ApprovalPolicy.NOT_REQUIRED:
        return False
    return required_by_default(effect)


def is_relaxation(effect: ToolEffect, policy: str) -> bool:
    """Whether setting ``policy`` lets a write run unattended whatever the
    default says: ``not_required`` on any write tool. Not only where the
    default asks for approval now — under ``NRLLM_APPROVAL_REQUIRED_FOR=none``
    the setting would otherwise become a relaxation, granted by nobody, the
    day the default is tightened."""
    return policy == ApprovalPolicy.NOT_REQUIRED and effect.is_write


def tools_needing_approval(
    offered: Mapping[str, object],
    overrides: Mapping[str, str],
    requested: Collection[str] = (),
) -> frozenset[str]:
    """The names among ``offered`` (name → tool) whose calls wait for an
    approval: by their policy (``overrides``: name → an operator's setting
    other than ``default``), or because the run's request asked."""
    return frozenset(
        name
        for name, tool in offered.items()
        if name in requested or requires_approval(tool.effect, overrides.get(name, "default"))
    )
