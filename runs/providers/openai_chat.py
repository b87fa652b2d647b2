"""A provider for OpenAI's chat completions protocol (OpenAI, vLLM, Ollama,
LiteLLM...), through the maintained ``openai`` SDK.

Endpoint and key come from the environment only. The SDK's own retries are
off: the run row decides retries. Every call passes the circuit breaker.

The SDK is imported when a run first uses this provider, not with the
module: it costs a process about 40 MB, which a worker serving other
providers (or the web process validating requests) need not carry.
"""

import json
import time

from django.conf import settings

from runs.providers import circuit
from runs.providers.base import ProviderError, ToolCall, Turn
from runs.vocabulary import FailureClass


class OpenAIChatProvider:
    kind = "openai"
    spec_schema = {
        "type": "object",
        "properties": {
            "kind": {"const": "openai"},
            "model": {"type": "string", "minLength": 1, "maxLength": 200},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "max_tokens": {"type": "integer", "minimum": 1},
        },
        "required": ["kind", "model"],
        "additionalProperties": False,
    }

    @staticmethod
    def configuration_problem() -> str | None:
        """Why runs cannot use this provider here, or None."""
        if not settings.NRLLM_OPENAI_API_KEY:
            return "provider 'openai' is not configured: set NRLLM_OPENAI_API_KEY"
        if not settings.NRLLM_OPENAI_BASE_URL:
            return "provider 'openai' is not configured: set NRLLM_OPENAI_BASE_URL"
        return None

    def __init__(self, spec: dict):
        problem = self.configuration_problem()
        if problem:
            raise ProviderError(problem, failure_class=FailureClass.CONFIGURATION)
        import openai

        self.model = spec["model"]
        self.options = {key: spec[key] for key in ("temperature", "max_tokens") if key in spec}
        self.circuit_key = f"{settings.NRLLM_OPENAI_BASE_URL} {self.model}"
        self.client = openai.OpenAI(
            base_url=settings.NRLLM_OPENAI_BASE_URL,
            api_key=settings.NRLLM_OPENAI_API_KEY,
            max_retries=0,
            timeout=openai.Timeout(
                settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS,
                connect=settings.NRLLM_OPENAI_CONNECT_TIMEOUT_SECONDS,
            ),
        )

    @classmethod
    def from_spec(cls, spec: dict, *, attempt: int) -> "OpenAIChatProvider":
        return cls(spec)

    def next_turn(self, messages: list[dict], tool_specs: list[dict]) -> Turn:
        import openai

        from runs.providers.openai_failures import to_provider_error

        circuit.before_call(self.circuit_key)
        tools = [{"type": "function", "function": spec} for spec in tool_specs]
        started = time.monotonic()
        try:
            completion = self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                **({"tools": tools} if tools else {}),
                **self.options,
            )
        except openai.OpenAIError as error:
            failure = to_provider_error(error)
            circuit.record_failure(self.circuit_key, failure.failure_class)
            raise failure from None
        circuit.record_success(self.circuit_key)
        return _turn(completion, latency_ms=int((time.monotonic() - started) * 1000))


def _turn(completion, *, latency_ms: int) -> Turn:
    if not completion.choices:
        raise ProviderError("the provider returned no choices", failure_class=FailureClass.UNKNOWN)
    choice = completion.choices[0]
    usage = completion.usage
    meta = {
        "model": completion.model,
        "finish_reason": choice.finish_reason,
        "usage": {
            "prompt_tokens": usage.prompt_tokens if usage else 0,
            "completion_tokens": usage.completion_tokens if usage else 0,
        },
        "latency_ms": latency_ms,
    }
    calls = [_tool_call(call) for call in choice.message.tool_calls or []]
    return Turn(content=choice.message.content or "", tool_calls=calls, meta=meta)


def _tool_call(call) -> ToolCall:
    name = call.function.name
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as error:
        return ToolCall(
            name=name,
            arguments=None,
            id=call.id,
            problem=f"the arguments of this call are not valid JSON ({error.msg}); "
            "send them again as a JSON object",
        )
    return ToolCall(name=name, arguments=arguments, id=call.id)
