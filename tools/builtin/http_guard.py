"""Where the HTTP tools may connect: an allowed host and port, at addresses
resolved once and checked.

``NRLLM_HTTP_ALLOWED_HOSTS`` entries:

- ``example.org`` allows that host on the URL scheme's default port only
  (80 for http, 443 for https);
- ``example.org:8443`` allows that host on that port;
- an IP address, ``10.0.0.5``, ``10.0.0.5:8080``, ``[fd00::5]:8080`` (or a
  bare ``fd00::5``), allows that exact address on that port (or the default
  one), even one of the ranges refused below.

A host name is resolved once, here; every address it resolves to is checked,
and the request is refused if any of them is not a public (global unicast)
address that the operator did not allow literally. Refused: loopback
(127.0.0.0/8, ::1), private (10/8, 172.16/12, 192.168/16, fc00::/7),
link-local (169.254/16 where cloud metadata lives, fe80::/10), this-network
0.0.0.0/8 and ::, carrier-grade NAT 100.64/10, multicast, broadcast,
reserved and documentation ranges, and everything else Python's
``ipaddress`` does not call ``is_global``; an IPv6 address that embeds an IPv4
one (``::ffff:10.0.0.5``, NAT64 ``64:ff9b::/96``) is judged by the IPv4
address it reaches, and the deprecated IPv4-compatible ``::/96``, the
IPv4-translated ``::ffff:0:0:0/96`` (SIIT) and the deprecated site-local
``fec0::/10`` (still routed inside some networks) are refused, although
``ipaddress`` calls them global.
The connection then dials one of those checked addresses and never resolves
the name again (``http_transport``), so a name re-bound between the check and
the connect reaches nothing new.
"""

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from django.conf import settings

from tools.contract import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``getaddrinfo`` gives for ``host`` (TCP), in its order."""
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


#: The one place a host name becomes addresses. Tests install a resolver of
#: their own here (the ``dns`` fixture, through monkeypatch) so that names
#: map to local servers without the system resolver or the internet; the
#: rest of the guard runs as it does in production. Nothing else sets it.
resolver: Callable[[str, int], list[str]] = system_resolver


@dataclass(frozen=True)
class Destination:
    """A checked URL's host and port and the addresses it may be dialled at."""

    #: As httpcore names the origin to its network backend: IDNA, lower case,
    #: an IPv6 address without brackets.
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True)
class Target:
    url: httpx.URL
    destination: Destination


@dataclass(frozen=True)
class _Entry:
    host: str
    port: int | None  # None: the default port of the URL's scheme

    def allows(self, host: str, port: int, scheme: str) -> bool:
        return self.host == host and port == (self.port or DEFAULT_PORTS[scheme])


def check_url(url: str | httpx.URL, *, host_allowed: bool = False) -> Target:
    """Parse ``url`` as the request will use it and check where it goes.

    Returns the URL and its ``Destination``. Raises ``ToolError`` (nothing has
    been sent) unless the URL is http(s) to an allowed host and port whose
    every address is public or allowed literally; the message says which
    rule refused it and what an operator could allow instead.

    ``host_allowed``: an operator's own setting names this URL (the approval
    webhook), so its host and port need no entry — which would let the
    tools reach it too; every address it resolves to is checked all the same.
    """
    parsed, host, port, entries = _allowed(url, host_allowed=host_allowed)
    shown = str(url)
    addresses = _addresses_of(shown, host, port)
    for address in addresses:
        reason = refusal_reason(address)
        literal = any(
            entry.allows(form, port, parsed.scheme) for entry in entries for form in _forms(address)
        )
        if reason and not literal:
            raise ToolError(
                f"refused {shown!r}: {host} resolves to {address}, {reason}; allow the "
                f"address itself in NRLLM_HTTP_ALLOWED_HOSTS to reach it"
            )
    return Target(parsed, Destination(host, port, addresses))


def check_url_allowed(url: str) -> None:
    """Raise ``ToolError`` unless ``url`` is http(s) to a host and port the
    allow list names; nothing is resolved (a run's webhook at enqueue: its
    addresses are checked when it is sent)."""
    _allowed(url, host_allowed=False)


def _allowed(url, *, host_allowed: bool):
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ToolError(f"refused {str(url)!r}: the URL is not valid ({error})") from None
    shown = str(url)
    if parsed.scheme not in DEFAULT_PORTS:
        raise ToolError(f"refused {shown!r}: only http and https URLs are allowed")
    host = canonical_host(parsed.raw_host.decode("ascii"))
    if not host:
        raise ToolError(f"refused {shown!r}: the URL has no host")
    port = parsed.port or DEFAULT_PORTS[parsed.scheme]
    entries = allowed_entries()
    if not host_allowed and not any(entry.allows(host, port, parsed.scheme) for entry in entries):
        raise ToolError(f"refused {shown!r}: {_not_allowed(entries, host, port)}")
    return parsed, host, port, entries


def refusal_reason(address: IPAddress) -> str | None:
    """Why ``address`` is refused unless allowed literally; None if it is public.

    Public is what ``ipaddress`` calls global, less the shared (CGNAT) range,
    the deprecated site-local ``fec0::/10``, the IPv4-translated
    ``::ffff:0:0:0/96`` and IPv4-compatible ``::/96`` ranges; an IPv4-mapped
    or NAT64 address is judged by the IPv4 address it embeds."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            reason = refusal_reason(embedded)
            return reason and f"an address embedding {embedded}, {reason}"
        if address in _IPV4_COMPATIBLE and not (address.is_loopback or address.is_unspecified):
            return "a deprecated IPv4-compatible address"
        if address in _IPV4_TRANSLATED:
            return "an IPv4-translated (SIIT) address"
        if address in _SITE_LOCAL:
            return "a deprecated site-local address"
    for is_it, name in [
        (address.is_loopback, "a loopback address"),
        (address.is_unspecified, "an unspecified address"),
        (address.is_link_local, "a link-local address (where cloud metadata services live)"),
        (address.is_multicast, "a multicast address"),
        (
            isinstance(address, ipaddress.IPv4Address) and address in _SHARED,
            "a shared (CGNAT) address",
        ),
        (address.is_private, "a private address"),
        (not address.is_global, "not a global address"),
    ]:
        if is_it:
            return name
    return None


def allowed_entries() -> list[_Entry]:
    """``NRLLM_HTTP_ALLOWED_HOSTS`` parsed; a malformed entry refuses every
    request, naming it, rather than being skipped or guessed at."""
    return [_parse_entry(entry) for entry in settings.NRLLM_HTTP_ALLOWED_HOSTS]


def _parse_entry(entry: str) -> _Entry:
    text = entry.strip()
    try:
        return _Entry(ipaddress.ip_address(text).compressed, None)  # a bare IPv4 or IPv6 address
    except ValueError:
        pass
    try:
        # A scheme without a default port, so that ``host:80`` keeps its port.
        parsed = httpx.URL(f"entry://{text}")
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or not parsed.raw_host or any(c in text for c in "/@?#"):
        raise ToolError(
            f"NRLLM_HTTP_ALLOWED_HOSTS entry {entry!r} is not a host, host:port or IP address"
        )
    return _Entry(canonical_host(parsed.raw_host.decode("ascii")), parsed.port)


def canonical_host(host: str) -> str:
    """``host`` as ``Destination.host`` holds it: an IP address compressed
    (``0:0::1`` is ``::1``, ``FD00::5`` is ``fd00::5``), a name in lower case."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


def _forms(address: IPAddress) -> set[str]:
    """How an allow-list entry may name ``address``: ``::ffff:10.0.0.5`` is 10.0.0.5."""
    mapped = isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped
    return {address.compressed, mapped.compressed} if mapped else {address.compressed}


def _not_allowed(entries: list[_Entry], host: str, port: int) -> str:
    if any(entry.host == host for entry in entries):
        return (
            f"port {port} of {host!r} is not allowed; an entry without a port allows only "
            f"the scheme's default port (add {host}:{port} to NRLLM_HTTP_ALLOWED_HOSTS)"
        )
    return f"host {host!r} is not in NRLLM_HTTP_ALLOWED_HOSTS"


def _addresses_of(shown: str, host: str, port: int) -> tuple[IPAddress, ...]:
    try:
        return (ipaddress.ip_address(host),)  # an address in the URL is not resolved
    except ValueError:
        pass
    try:
        answers = resolver(host, port)
    except OSError as error:
        raise ToolError(f"cannot reach {shown!r}: {host} does not resolve ({error})") from None
    addresses = tuple(dict.fromkeys(ipaddress.ip_address(answer) for answer in answers))
    if not addresses:
        raise ToolError(f"cannot reach {shown!r}: {host} resolves to no address")
    return addresses
