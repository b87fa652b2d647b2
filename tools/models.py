"""What operators may set per tool, and the tables the builtin tools act on.

Deliberately absent: any column holding a tool's effect (G1). The effect is
read from the tool's class, never from here.
"""

from django.db import models

from tools.approval_policy import ApprovalPolicy


class ToolSetting(models.Model):
    """An operator's switch for one registered tool."""

    name = models.CharField(max_length=100, primary_key=True)
    enabled = models.BooleanField(default=True)
    #: Whether its calls wait for an operator's approval (G14):
    #: ``tools.approval_policy`` says what ``default`` means for its effect.
    approval = models.CharField(
        max_length=16, choices=ApprovalPolicy.choices, default=ApprovalPolicy.DEFAULT
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            (
                "relax_approval",
                "Can let a tool whose effect needs approval by default run without it",
            )
        ]

    def __str__(self) -> str:
        return self.name


class Note(models.Model):
    """A note the builtin note tools read and write, keyed by slug."""

    slug = models.SlugField(max_length=200, unique=True)
    body = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class OutboxNotification(models.Model):
    """A notification ``send_notification`` appended: each call adds a row."""

    recipient = models.CharField(max_length=200)
    message = models.TextField()
    run_id = models.UUIDField(db_index=True)
    idempotency_key = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"to {self.recipient}"
