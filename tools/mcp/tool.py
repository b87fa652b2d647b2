"""One MCP server's tool as the runtime sees it: a ``Tool`` whose effect
comes from the toolset's declaration (or is ``non_idempotent_write`` when
undeclared), whose schema and description come from the server.

A call carries the run's idempotency key in the request's ``_meta``
(``IDEMPOTENCY_KEY_META``), so a server that honours it can recognise a
repeated write. Its outcome is mapped as the runtime needs it:

- a result with ``isError``: a ``ToolError``, the server's text fed back to
  the model;
- an answer past the cap on one message: its start, marked ``truncated``
  (the server answered; what it said is not parsed);
- nothing sent (the server cannot be reached): a ``ToolError``;
- sent and no answer (the server went away, the connection broke, the time
  limit ran out): ``ToolOutcomeUnknown`` — for a write, a write in doubt
  (G13), which for a ``non_idempotent_write`` stops the run.
"""

import time
from typing import Any

from tools.contract import Tool, ToolContext, ToolError, ToolOutcomeUnknown
from tools.effects import ToolEffect
from tools.mcp import metrics
from tools.mcp.declaration import McpToolset
from tools.mcp.failures import MaybeSent, NotSent, TruncatedAnswer
from tools.mcp.results import cut_value, error_text, result_value
from tools.mcp.sessions import sessions

IDEMPOTENCY_KEY_META = "nrllm-ops/idempotencyKey"
#: How much later than the call's own limit the runtime's stop (SIGALRM,
#: ``tools.deadline``) comes: the call ends by its own wait first, where
#: it can tell a call never sent from one sent and not answered.
RUNTIME_STOP_GRACE_SECONDS = 2.0
RUN_ID_META = "nrllm-ops/runId"


class McpTool(Tool):
    """A tool the server listed. Built per listing; ``name`` is the
    registered name (``<server>__<tool>``)."""

    def __init__(
        self,
        toolset: type[McpToolset],
        remote_name: str,
        *,
        effect: ToolEffect,
        declared: bool,
        description: str,
        parameters: dict,
        hints: dict[str, bool],
        contradictions: list[str],
        timeout_seconds: float,
    ):
        self.toolset = toolset
        self.remote_name = remote_name
        self.name = toolset.registered_name(remote_name)
        self.effect = effect
        self.declared = declared
        self.description = description
        self.parameters = parameters
        self.hints = hints
        self.contradictions = contradictions
        self.timeout_seconds = timeout_seconds

    @property
    def server(self) -> str:
        return self.toolset.server

    def time_limit(self) -> float:
        """What the runtime covers with the lease and stops the call at: a
        little past the call's own limit, which ends it first."""
        return self.timeout_seconds + RUNTIME_STOP_GRACE_SECONDS

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        if not isinstance(arguments, dict):
            # MCP takes an object; the SDK would refuse anything else before
            # sending, which must not pass for a call that may have been sent.
            raise ToolError(f"{self.name}: arguments must be a JSON object, not {arguments!r}")
        meta = {IDEMPOTENCY_KEY_META: context.idempotency_key, RUN_ID_META: context.run_id}
        started = time.monotonic()
        outcome = "error"
        try:
            result = sessions().call_tool(
                self.toolset,
                self.remote_name,
                arguments,
                meta=meta,
                timeout=self.timeout_seconds,
            )
            if isinstance(result, TruncatedAnswer):
                outcome = "ok"
                return cut_value(result.start)
            if result.is_error:
                raise ToolError(f"{self.name}: the server reports an error: {error_text(result)}")
            outcome = "ok"
            return result_value(result)
        except NotSent as error:
            outcome = "not_sent"
            raise ToolError(
                f"{self.name}: MCP server {self.server!r} cannot be reached, nothing was sent: "
                f"{error}"
            ) from None
        except MaybeSent as error:
            outcome = "no_answer"
            raise ToolOutcomeUnknown(
                f"{self.name}: MCP server {self.server!r} gave no answer to a call it may have "
                f"received: {error}"
            ) from None
        finally:
            metrics.observe_call(self.server, outcome, time.monotonic() - started)
