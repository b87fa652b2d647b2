"""For the schema: the two bodies ``POST /api/runs/`` takes, a whole
request or a start by agent. The runtime checks them
(``agents.starting.expand``, ``runs.runtime.run_request``), not these."""

from rest_framework import serializers


class RunRequestSerializer(serializers.Serializer):
    """For the schema: the body ``POST /api/runs/`` takes (``enqueue_run``'s format)."""

    prompt = serializers.CharField()
    tools = serializers.ListField(child=serializers.CharField(), required=False)
    provider = serializers.JSONField(help_text='{"kind": "scripted", "turns": [...]}')
    instructions = serializers.CharField(
        required=False, help_text="the system message, sent before the prompt"
    )
    webhook = serializers.CharField(
        required=False, help_text="a URL told when the run ends (G19); its host must be allowed"
    )
    max_iterations = serializers.IntegerField(min_value=1, required=False)


class RunStartByAgentSerializer(serializers.Serializer):
    """For the schema: a run of an agent's version (G18)."""

    agent = serializers.CharField(help_text="the agent's name")
    input = serializers.CharField(help_text="the run's input: its prompt")
    version = serializers.IntegerField(
        min_value=1, required=False, help_text="a version's number; the latest if left out"
    )
    webhook = serializers.CharField(required=False, help_text="in place of the agent's")
    max_iterations = serializers.IntegerField(
        min_value=1, required=False, help_text="at most the version's"
    )
    max_total_tokens = serializers.IntegerField(
        min_value=1, required=False, help_text="at most the version's"
    )
    max_cost = serializers.CharField(required=False, help_text="at most the version's")
