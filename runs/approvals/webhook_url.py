"""What of a webhook's URL may be shown: its origin, never its path, query
or user info, which often hold the receiver's credential
(``/services/T0/B0/<token>``, ``?token=``).

``origin`` is the URL as shown. ``scrubbed`` is any text that may quote the
URL or a piece of it — a receiver's answer, an error, a traceback — with
each piece replaced before the text is logged or stored, however it is
written: the URL itself (by its origin), and each path segment, query
value, user name, password and fragment as the URL holds it
(percent-encoded), decoded, encoded again (``%2F`` or ``%2f``, ``%20`` or
``+``) and JSON-escaped, and as held encoded again (``%252F``, the URL
quoted in a link); the user info also as the HTTP client sends it
(``Authorization: Basic``). A receiver that echoes back its token, whole or
just the one part, has it replaced. The run-ended webhook and the approval
webhook both show their URL and their texts only through these two.
"""

import base64
import functools
import json
import re
import traceback
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

import httpx

#: What stands for a hidden part.
HIDDEN = "…"
#: A part shorter than this is left: none is a credential, and replacing
#: one would cut up the text around it (``in`` out of ``invalid``).
SHORTEST_SECRET = 4
#: The characters a URL's path keeps unencoded besides letters and digits
#: (RFC 3986's ``pchar``): how an HTTP client may encode a segment again.
PATH_SAFE = "!$&'()*+,;=:@"


def origin(url: str) -> str:
    """``url`` without its path and query, which may hold a token."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "(the webhook URL)"
    port = f":{parsed.port}" if parsed.port else ""
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return f"{parsed.scheme}://{host}{port}/…"


def scrubbed(text: str, url: str) -> str:
    """``text`` with ``url`` shown as its origin and no secret part of it
    left, in any of the forms the module names. The origin itself (its
    host, its port) is left where it stands, whatever part it contains
    (``hook`` in ``hooks.example.org``)."""
    whole, parts, kept = _patterns(url)
    if whole is not None:
        text = whole.sub(lambda _: origin(url), text)
    if parts is not None:
        text = parts.sub(lambda found: _hidden_unless(found.group(), kept), text)
    return text


def scrubbed_traceback(url: str) -> str:
    """The exception being handled and its traceback, as ``logger.exception``
    would log them, ``scrubbed`` of ``url``: an unforeseen error's text may
    quote the URL."""
    return scrubbed(traceback.format_exc().rstrip(), url)


@functools.lru_cache(maxsize=64)
def _patterns(url: str) -> tuple[re.Pattern | None, re.Pattern | None, frozenset[str]]:
    """A pattern for the URL written whole; one for its secret parts and
    the forms of its origin kept; those kept (lower case). The longest form
    first at each place: a part is replaced whole rather than a shorter
    part inside it, and a host is kept whole rather than a part inside it
    replaced. Case-insensitive: ``%2F`` and ``%2f`` are one form (a token
    differing only in case is replaced too)."""
    written = {url}
    try:
        written.add(str(httpx.URL(url)))  # as an HTTP client writes it
    except httpx.InvalidURL:
        pass
    kept = {origin(url).lower()} | {form for each in written for form in _origin_forms(each)}
    secrets = {form for each in written for part in _parts(each) for form in _forms(part)}
    secrets = {form for form in secrets if len(form) >= SHORTEST_SECRET}
    return _alternatives(written), _alternatives(secrets | kept), frozenset(kept)


def _hidden_unless(found: str, kept: frozenset[str]) -> str:
    return found if found.lower() in kept else HIDDEN


def _origin_forms(url: str) -> set[str]:
    """``url``'s host, and its host and port, as it writes them (lower case)."""
    try:
        split = urlsplit(url)
    except ValueError:
        return set()
    host_and_port = split.netloc.rpartition("@")[2].lower()
    return {form for form in (host_and_port, split.hostname or "") if form}


def _alternatives(forms: set[str]) -> re.Pattern | None:
    if not forms:
        return None
    ordered = sorted(forms, key=len, reverse=True)
    return re.compile("|".join(re.escape(form) for form in ordered), re.IGNORECASE)


def _parts(url: str) -> list[str]:
    """The secret parts of ``url`` as it writes them: each path segment,
    each query value (a query item without ``=`` is a value), the user
    name, the password, their Basic credentials and the fragment."""
    try:
        split = urlsplit(url)
    except ValueError:
        return [url]  # no parts to tell apart: the whole of it is secret
    parts = split.path.split("/")
    for item in re.split("[&;]", split.query):
        parts.append(item.partition("=")[2] if "=" in item else item)
    userinfo = split.netloc.rpartition("@")[0]
    parts += [*userinfo.split(":", 1), split.fragment]
    if userinfo:
        parts.append(_basic_credentials(userinfo))
    return [part for part in parts if part]


def _basic_credentials(userinfo: str) -> str:
    """The user info as the receiver gets it: the HTTP client sends it as
    ``Authorization: Basic`` and the base64 of the decoded ``user:password``,
    which is what a receiver naming the credentials it refused echoes."""
    user, _, password = userinfo.partition(":")
    return base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()


def _forms(part: str) -> set[str]:
    """``part`` as written, decoded, encoded again, and JSON-escaped; and
    as written, encoded again (the URL quoted in a link: ``%252F``)."""
    decoded = {unquote(part), unquote_plus(part)}
    forms = {part, *decoded, quote(part, safe="")}
    for value in decoded:
        forms |= {quote(value, safe=""), quote(value, safe=PATH_SAFE), quote_plus(value)}
        escaped = json.dumps(value)[1:-1]
        forms |= {escaped, escaped.replace("/", "\\/")}
    return forms
