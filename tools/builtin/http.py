"""HTTP tools, limited to ``NRLLM_HTTP_ALLOWED_HOSTS``."""

from django.conf import settings

from tools.builtin.http_guard import MAX_REDIRECTS, guarded_get, guarded_post_json
from tools.contract import Tool, ToolContext
from tools.effects import ToolEffect

_URL = {"type": "string", "minLength": 1, "maxLength": 2000}


class HttpGet(Tool):
    name = "http_get"
    description = "Fetch a URL with GET (allowed hosts only) and return status and body."
    parameters = {
        "type": "object",
        "properties": {"url": _URL},
        "required": ["url"],
        "additionalProperties": False,
    }

    def time_limit(self) -> float:
        # Each hop of a redirect chain may use the whole I/O timeout.
        return settings.NRLLM_HTTP_TIMEOUT_SECONDS * (MAX_REDIRECTS + 1)

    def run(self, arguments, context: ToolContext):
        return guarded_get(arguments["url"])


class PostWebhook(Tool):
    """Each POST may trigger an action at the receiver: not idempotent. The
    ``Idempotency-Key`` header lets a receiver that supports it drop repeats."""

    name = "post_webhook"
    description = "POST a JSON payload to a webhook URL (allowed hosts only)."
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = {
        "type": "object",
        "properties": {"url": _URL, "payload": {}},
        "required": ["url", "payload"],
        "additionalProperties": False,
    }

    def time_limit(self) -> float:
        return settings.NRLLM_HTTP_TIMEOUT_SECONDS

    def run(self, arguments, context: ToolContext):
        return guarded_post_json(
            arguments["url"],
            arguments["payload"],
            headers={"Idempotency-Key": context.idempotency_key},
        )
