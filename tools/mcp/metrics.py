"""Metrics per MCP server: calls by outcome, their latency, listings.

In multiprocess mode their files are folded at exit with the runtime's
(``runs.models.metrics`` registers that for the process).
"""

from prometheus_client import Counter, Histogram

CALLS = Counter(
    "nrllm_mcp_calls_total",
    "MCP tool calls by server and outcome: ok, error (the server reported one), "
    "not_sent (the server could not be reached), no_answer (sent, no answer)",
    ["server", "outcome"],
)
CALL_SECONDS = Histogram(
    "nrllm_mcp_call_seconds",
    "MCP tool call latency by server",
    ["server"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
LISTINGS = Counter(
    "nrllm_mcp_listings_total",
    "Tool listings asked of MCP servers by outcome: ok, unreachable",
    ["server", "outcome"],
)


def observe_call(server: str, outcome: str, seconds: float) -> None:
    CALLS.labels(server, outcome).inc()
    CALL_SECONDS.labels(server).observe(seconds)
