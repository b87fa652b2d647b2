"""HTTP tools, limited to ``NRLLM_HTTP_ALLOWED_HOSTS``.

Each hop is checked and pinned by ``http_guard`` before anything is sent (a
redirect is checked like the first URL), dialled by ``http_transport``, and
its answer read up to a cap. How a failure is reported depends on whether the
request may have left: before that (not allowed, no address, connection
refused or timed out) it is a ``ToolError``; after it, a read-only GET is
still a ``ToolError``, while a POST raises ``ToolOutcomeUnknown``, because the
receiver may have acted on it. A POST that got an answer, whatever its status
(a redirect included, never followed), was delivered: a result.

Each exchange (connect, send, the whole answer read) ends by a deadline of
its own, ``EXCHANGE_TIMEOUTS`` I/O timeouts, and a tool's time limit is
above its own deadlines, so where the runtime's SIGALRM can stop a tool it
does not beat them; should it still fire (a name resolving slowly), a POST
stopped before it connected is a ``ToolError`` — nothing was sent — and not
the runtime's ``ToolTimeout``, which it takes for a write in doubt.
"""

from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx
from django.conf import settings

from tools.builtin.http_guard import Target, check_url
from tools.builtin.http_transport import ACCEPT_ENCODING, Deadline, PinnedTransport, read_capped
from tools.contract import Tool, ToolContext, ToolError, ToolOutcomeUnknown, WhereToCheck
from tools.deadline import ToolTimeout
from tools.effects import ToolEffect

MAX_REDIRECTS = 5
#: One exchange may take this many ``NRLLM_HTTP_TIMEOUT_SECONDS`` in all:
#: a connect, a write and a read each up to the timeout.
EXCHANGE_TIMEOUTS = 3
#: What a tool's time limit allows, per exchange, above the exchange's
#: deadline: resolving the name (``getaddrinfo`` takes no timeout of ours)
#: and closing up.
RESOLVE_SECONDS = 5
_URL = {"type": "string", "minLength": 1, "maxLength": 2000}
#: Failures that happen before a byte of the request is written: connecting
#: (TCP or TLS) or getting a connection. Every hop has a pool of its own, so
#: no request is ever written to a kept-alive connection that then turns out
#: dead — a failure after connecting is after (possibly) sending.
_NOTHING_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class _Answer:
    status: int
    content_type: str
    location: str | None  # a redirect's target, its body unread
    body: str = ""
    truncated: bool = False

    def described(self, url: httpx.URL) -> dict:
        return {
            "url": str(url),
            "status": self.status,
            "content_type": self.content_type,
            "body": self.body,
            "truncated": self.truncated,
        }


def exchange_seconds() -> float:
    """The deadline of one exchange."""
    return EXCHANGE_TIMEOUTS * settings.NRLLM_HTTP_TIMEOUT_SECONDS


def _exchange(method: str, target: Target, transport: PinnedTransport, **kwargs) -> _Answer:
    """Send one request to a checked target and read its answer (not a
    redirect's body). httpx errors propagate for the caller to classify."""
    timeout = httpx.Timeout(settings.NRLLM_HTTP_TIMEOUT_SECONDS)
    headers = {"Accept-Encoding": ACCEPT_ENCODING, **kwargs.pop("headers", {})}
    with (
        httpx.Client(transport=transport, timeout=timeout, trust_env=False) as client,
        client.stream(method, target.url, headers=headers, **kwargs) as response,
    ):
        content_type = response.headers.get("content-type", "")
        if response.is_redirect:
            return _Answer(response.status_code, content_type, response.headers["location"])
        body, truncated = read_capped(response)
        return _Answer(response.status_code, content_type, None, body, truncated)


def _transport(target: Target) -> PinnedTransport:
    return PinnedTransport(target.destination, Deadline(exchange_seconds()))


def _failure(method: str, url: httpx.URL, error: httpx.HTTPError, deadline: Deadline) -> str:
    if isinstance(error, httpx.TimeoutException) and deadline.passed:
        return f"{method} {url} did not complete within its deadline of {deadline.seconds:g}s"
    if isinstance(error, httpx.TimeoutException):
        return f"{method} {url} timed out after {settings.NRLLM_HTTP_TIMEOUT_SECONDS}s"
    return f"{method} {url} failed: {error}"


def guarded_get(url: str) -> dict:
    """GET ``url`` following redirects only to allowed, checked destinations.
    Every failure, the runtime's ``ToolTimeout`` included, is a plain
    ``ToolError``: a GET changes nothing."""
    for _ in range(MAX_REDIRECTS + 1):
        try:
            target = check_url(url)
            transport = _transport(target)
            answer = _exchange("GET", target, transport)
        except ToolTimeout:
            raise ToolError(f"GET {url} stopped at its time limit") from None
        except httpx.HTTPError as error:
            raise ToolError(_failure("GET", target.url, error, transport.deadline)) from None
        if answer.location is None:
            return answer.described(target.url)
        url = urljoin(str(target.url), answer.location)  # check_url refuses a malformed one
    raise ToolError(f"refused: more than {MAX_REDIRECTS} redirects")


def guarded_post_json(url: str, payload, headers: dict[str, str]) -> dict:
    """POST ``payload`` as JSON once. A redirect is the receiver's answer to
    a POST it got, so it is a result like any other status, with its
    ``Location`` in ``redirect_not_followed``: following it would send the
    write a second time, and raising would tell the model nothing was done.
    Raises ``ToolOutcomeUnknown`` when the POST may have been received but
    no complete answer came back, and a plain ``ToolError`` when nothing was
    sent — stopped by the runtime's time limit before connecting included."""
    transport = None
    try:
        target = check_url(url)
        transport = _transport(target)
        answer = _exchange("POST", target, transport, json=payload, headers=headers)
    except ToolTimeout:
        # The alarm may fire anywhere: resolving, connecting, sending, reading.
        if transport is None or not transport.connected:
            raise ToolError(
                f"POST {url} stopped at its time limit before it connected: nothing was sent"
            ) from None
        raise ToolOutcomeUnknown(
            f"POST {url} stopped at its time limit after connecting, after the request may "
            "have been received: whether the webhook acted on it is unknown"
        ) from None
    except _NOTHING_SENT as error:
        raise ToolError(_failure("POST", target.url, error, transport.deadline)) from None
    except httpx.HTTPError as error:
        raise ToolOutcomeUnknown(
            f"{_failure('POST', target.url, error, transport.deadline).rstrip('.')}, after the "
            "request may have been received: whether the webhook acted on it is unknown"
        ) from None
    described = answer.described(target.url)
    if answer.location is not None:
        # As the receiver sent it: resolving it against the URL could fail.
        described["redirect_not_followed"] = answer.location
    return described


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
        # Each hop of a redirect chain: its name resolved, then its exchange.
        return (RESOLVE_SECONDS + exchange_seconds()) * (MAX_REDIRECTS + 1)

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
        # Above the exchange's own deadline, so that the runtime's alarm does
        # not beat it: the exchange reports how far the POST got, the alarm
        # cannot always (guarded_post_json).
        return RESOLVE_SECONDS + exchange_seconds()

    def run(self, arguments, context: ToolContext):
        return guarded_post_json(
            arguments["url"],
            arguments["payload"],
            headers={"Idempotency-Key": context.idempotency_key},
        )

    def where_to_check(self, arguments, idempotency_key):
        # The host only: a webhook's path and query may hold its secret.
        url = arguments.get("url") if isinstance(arguments, dict) else None
        try:
            host = urlsplit(url).hostname if isinstance(url, str) else None
        except ValueError:  # a URL the tool would have refused
            host = None
        receiver = f"the receiver at {host}" if host else "the receiver"
        return WhereToCheck(
            f"{receiver}: its log or records show whether a POST came with the header "
            "Idempotency-Key set to this key (applied) or not (not_applied)"
        )
