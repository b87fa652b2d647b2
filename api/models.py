"""What the API itself must remember: the Idempotency-Key of run creation."""

from django.conf import settings
from django.db import models

from runs.models import AgentRun


class RunCreationKey(models.Model):
    """A client's ``Idempotency-Key`` for ``POST /api/runs/``: the same key with
    the same body returns the same run; with another body it is refused."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    body_sha256 = models.CharField(max_length=64)
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="run_creation_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.key} -> run {self.run_id}"
