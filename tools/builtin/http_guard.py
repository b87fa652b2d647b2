"""Outbound HTTP for tools: only to allowed hosts, with timeouts, redirects checked.

``NRLLM_HTTP_ALLOWED_HOSTS`` lists hosts (``example.org``) or host and port
(``127.0.0.1:8080``). Every hop of a redirect chain is checked, so an allowed
host cannot bounce a request to one that is not.
"""

from urllib.parse import urljoin, urlsplit

import httpx
from django.conf import settings

from tools.contract import ToolError

MAX_REDIRECTS = 5
MAX_BODY_CHARS = 64_000


def check_url_allowed(url: str) -> None:
    """Raise ``ToolError`` unless ``url`` is http(s) to an allowed host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ToolError(f"refused {url!r}: only http and https URLs are allowed")
    host = (parts.hostname or "").lower()
    if not host:
        raise ToolError(f"refused {url!r}: the URL has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ToolError(f"refused {url!r}: the port is not valid") from None
    allowed = {entry.lower() for entry in settings.NRLLM_HTTP_ALLOWED_HOSTS}
    if host not in allowed and f"{host}:{port}" not in allowed:
        raise ToolError(f"refused {url!r}: host {host!r} is not in NRLLM_HTTP_ALLOWED_HOSTS")


def _client() -> httpx.Client:
    # Redirects are followed by hand below, so each hop is checked.
    return httpx.Client(
        follow_redirects=False,
        timeout=httpx.Timeout(settings.NRLLM_HTTP_TIMEOUT_SECONDS),
        trust_env=False,
    )


def _describe(response: httpx.Response) -> dict:
    return {
        "status": response.status_code,
        "content_type": response.headers.get("content-type", ""),
        "body": response.text[:MAX_BODY_CHARS],
        "truncated": len(response.text) > MAX_BODY_CHARS,
    }


def guarded_get(url: str) -> dict:
    """GET ``url`` following redirects only between allowed hosts."""
    check_url_allowed(url)
    with _client() as client:
        for _ in range(MAX_REDIRECTS + 1):
            response = _send(client, "GET", url)
            if not response.is_redirect:
                return {"url": url, **_describe(response)}
            url = urljoin(url, response.headers["location"])
            check_url_allowed(url)
    raise ToolError(f"refused: more than {MAX_REDIRECTS} redirects")


def guarded_post_json(url: str, payload, headers: dict[str, str]) -> dict:
    """POST ``payload`` as JSON once. A redirect is reported, never followed,
    because following it would send the write a second time."""
    check_url_allowed(url)
    with _client() as client:
        response = _send(client, "POST", url, json=payload, headers=headers)
    if response.is_redirect:
        raise ToolError(
            f"the webhook answered {response.status_code} redirecting to "
            f"{response.headers.get('location')!r}; a POST is not re-sent"
        )
    return {"url": url, **_describe(response)}


def _send(client: httpx.Client, method: str, url: str, **kwargs) -> httpx.Response:
    try:
        return client.request(method, url, **kwargs)
    except httpx.TimeoutException:
        raise ToolError(
            f"{method} {url} timed out after {settings.NRLLM_HTTP_TIMEOUT_SECONDS}s"
        ) from None
    except httpx.HTTPError as error:
        raise ToolError(f"{method} {url} failed: {error}") from None
