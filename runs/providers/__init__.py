"""LLM providers, chosen by the ``kind`` of a run request's ``provider``."""

from runs.providers.base import Provider, ProviderError, ToolCall, Turn
from runs.providers.openai_chat import OpenAIChatProvider
from runs.providers.scripted import ScriptedProvider

PROVIDER_KINDS = {
    ScriptedProvider.kind: ScriptedProvider,
    OpenAIChatProvider.kind: OpenAIChatProvider,
}

__all__ = ["PROVIDER_KINDS", "Provider", "ProviderError", "ToolCall", "Turn", "build_provider"]


def build_provider(spec: dict, *, attempt: int) -> Provider:
    """The provider a (validated) request names, for the given attempt."""
    return PROVIDER_KINDS[spec["kind"]].from_spec(spec, attempt=attempt)
