"""The provider circuit breaker's rows: one per endpoint and model, and
each change of its state (``runs.providers.circuit`` drives them)."""

from django.db import models


class ProviderCircuit(models.Model):
    """The circuit breaker of one provider endpoint and model, shared by all
    workers: ``closed`` (calls go through), ``open`` (calls fail fast with
    ``circuit_open``), ``half_open`` (one trial call decides)."""

    key = models.CharField(max_length=500, unique=True)  # "<base url> <model>"
    state = models.CharField(max_length=16, default="closed")
    failures = models.PositiveIntegerField(default=0)
    window_started_at = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    trial_started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return f"{self.key}: {self.state}"


class CircuitTransition(models.Model):
    """Each change of a circuit's state, for operators."""

    circuit = models.ForeignKey(
        ProviderCircuit, on_delete=models.CASCADE, related_name="transitions"
    )
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=300)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.from_state} → {self.to_state}"
