"""A provider for OpenAI's chat completions protocol (OpenAI, vLLM, Ollama,
LiteLLM...), through the maintained ``openai`` SDK.

Endpoint and key come from the environment only. The SDK's own retries are
off: the run row decides retries. Every call passes the circuit breaker.

The SDK is imported when a run first uses this provider, not with the
module: it costs a process about 40 MB, which a worker serving other
providers (or the web process validating requests) need not carry. A
worker loads it once, before its work horses fork (``runs.workers.preload.load_for_runs``).

One set of clients per process and configuration (``openai_clients``): its
pools of connections, sized to the worker's slots, and its TLS context serve
every run and thread; building them per run cost more CPU than the run's own
statements.
"""

import json
import time

from django.conf import settings

from ground.database import release_connection
from runs.models.vocabulary import FailureClass
from runs.providers import circuit
from runs.providers.base import ProviderError, Turn
from runs.providers.openai_answer import MalformedAnswer, turn_of, unparsed
from runs.providers.openai_clients import shared_clients


class OpenAIChatProvider:
    kind = "openai"
    #: Set when a shared rate limit covers the configuration
    #: (``runs.runtime.rate_limit``): a 429 with ``Retry-After`` pauses every
    #: worker there, so the circuit does not count it as well — a few 429s
    #: of a burst's jitter would open it, and fail every run's call fast.
    paused_on_429 = False
    spec_schema = {
        "type": "object",
        "properties": {
            "kind": {"const": "openai"},
            "model": {"type": "string", "minLength": 1, "maxLength": 200},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            # At most what a call's reservation holds (G21; models answer far less).
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": 10**9},
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
        self.model = spec["model"]
        self.options = {key: spec[key] for key in ("temperature", "max_tokens") if key in spec}
        if "max_tokens" in self.options:
            # JSON Schema's integer includes 40.0: whole, for the API and the reservation.
            self.options["max_tokens"] = int(self.options["max_tokens"])
        self.circuit_key = f"{settings.NRLLM_OPENAI_BASE_URL} {self.model}"
        self.client = shared_clients()
        #: How long one call may take by its client's timeouts (the SDK's
        #: retries are off): the heartbeat keeps the lease that long (G16).
        self.call_seconds = (
            settings.NRLLM_OPENAI_CONNECT_TIMEOUT_SECONDS
            + settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS
        )

    @classmethod
    def from_spec(cls, spec: dict, *, attempt: int) -> "OpenAIChatProvider":
        return cls(spec)

    def next_turn(self, messages: list[dict], tool_specs: list[dict]) -> Turn:
        import openai

        from runs.providers.openai_failures import to_provider_error

        trial = circuit.before_call(self.circuit_key)
        # The model takes seconds: its connection serves other runs meanwhile.
        release_connection()
        tools = [{"type": "function", "function": spec} for spec in tool_specs]
        body = {"model": self.model, "messages": messages, **self.options}
        if "max_tokens" in body:
            body[settings.NRLLM_OPENAI_MAX_TOKENS_PARAMETER] = body.pop("max_tokens")
        if tools:
            body["tools"] = tools
        started = time.monotonic()
        try:
            # The SDK's documented way to send a body as it is: the same
            # client, auth (as ``chat.completions.create`` asks for it),
            # timeouts and errors, without ``create``'s check and transform
            # of every argument against its typed parameters, and the answer
            # as parsed JSON (``openai_answer`` reads it): either typed step
            # cost more CPU than the rest of the turn.
            try:
                answer = self.client.post(
                    "/chat/completions", body=body, cast_to=object, options=_BEARER_AUTH
                )
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
                # Sent as JSON, and not: the SDK's parse of the body (a body
                # not UTF-8, or nested past the parser's recursion, is not a
                # ``JSONDecodeError``).
                raise MalformedAnswer(f"not JSON ({unparsed(error)})") from None
            turn = turn_of(answer, latency_ms=int((time.monotonic() - started) * 1000))
        except (openai.OpenAIError, ProviderError) as error:
            failure = error if isinstance(error, ProviderError) else to_provider_error(error)
            paused = failure.failure_class == FailureClass.RATE_LIMIT and failure.retry_after
            if not (paused and self.paused_on_429):
                circuit.record_failure(self.circuit_key, failure.failure_class)
            raise failure from None
        # Only an answer read whole closes a circuit: a trial answered with
        # a body that is not one failed.
        if trial:
            circuit.record_success(self.circuit_key)
        return turn


#: The request options ``chat.completions.create`` sends: the API key as a
#: bearer token.
_BEARER_AUTH = {"security": {"bearer_auth": True}}
