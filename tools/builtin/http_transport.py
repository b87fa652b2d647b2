"""How the HTTP tools reach a checked destination: dial the addresses the
guard checked, and read a bounded amount of the answer.

The connection is made by httpcore, as for any httpx client, except that its
network backend dials the ``Destination``'s checked addresses instead of
resolving the host name again. Everything above the TCP connection still
sees the URL's host name: the ``Host`` header, TLS SNI and certificate
verification (httpcore starts TLS with ``server_hostname`` set to the origin's
host, not to the address dialled).
"""

import codecs
import functools
import os
import ssl
import zlib
from collections.abc import Callable

import httpcore
import httpx

from tools.builtin.http_guard import Destination

#: Enough decoded bytes for ``MAX_BODY_CHARS`` characters of any UTF-8 text.
MAX_BODY_CHARS = 64_000
MAX_BODY_BYTES = 4 * MAX_BODY_CHARS
#: Only what ``read_capped`` can decompress with its output bounded.
ACCEPT_ENCODING = "gzip, deflate"


class _PinnedBackend(httpcore.SyncBackend):
    """Connects only to the destination the guard checked, at its checked
    addresses (in the resolver's order, the next one if one refuses)."""

    def __init__(self, destination: Destination):
        self._destination = destination

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if (host, port) != (self._destination.host, self._destination.port):
            # Not reachable through the guard's API; a second line of defence
            # should httpx ever name an origin other than the checked URL's.
            raise httpcore.ConnectError(f"{host}:{port} was not checked by the guard")
        failure = None
        for address in self._destination.addresses:
            try:
                return super().connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:  # nothing sent
                failure = error
        raise failure


class PinnedTransport(httpx.HTTPTransport):
    """An ``httpx.HTTPTransport`` whose connections dial ``destination``.

    httpx 0.28 does not take an httpcore network backend (encode/httpx#3749
    proposes it), so the pool its transport built is replaced by one with the
    pinned backend; ``handle_request`` — the httpx ↔ httpcore mapping of
    requests, responses and exceptions — is httpx's own. httpcore is pinned
    in requirements.txt for this, and the tests dial names only the test's
    resolver knows, so a pool that resolved by itself would fail them.
    """

    def __init__(self, destination: Destination):
        context = ssl_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        super().__init__(verify=context, trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context, network_backend=_PinnedBackend(destination)
        )


@functools.cache
def ssl_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """httpx's default verification (certifi's CAs, or ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` when set), built once: loading the CAs costs ~10 ms."""
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    return httpx.create_ssl_context(trust_env=False)


def read_capped(response: httpx.Response) -> tuple[str, bool]:
    """The body as text, at most ``MAX_BODY_CHARS``, and whether it was cut.

    Reads raw bytes and decompresses them itself with the output bounded, so
    neither a long body nor a compression bomb costs more than about
    ``MAX_BODY_BYTES`` plus one network read: the reading stops there and the
    connection is closed with the rest unread. (httpx's ``iter_bytes``
    decompresses a whole network read at once, about 1000:1 for deflate, and
    stacks layers such as ``gzip, gzip``.) A body in an encoding not decoded
    here, or corrupt, is shown as far as it decoded, marked truncated.
    """
    decompress = _decompressor(response.headers.get("content-encoding", ""))
    body = bytearray()
    complete = decompress is not None
    if decompress is not None:
        for raw in response.iter_raw():
            try:
                body += decompress(raw, MAX_BODY_BYTES + 1 - len(body))
            except zlib.error:
                complete = False
                break
            if len(body) > MAX_BODY_BYTES:
                complete = False
                break
    text = bytes(body[:MAX_BODY_BYTES]).decode(_charset(response), errors="replace")
    return text[:MAX_BODY_CHARS], not complete or len(text) > MAX_BODY_CHARS


def _decompressor(content_encoding: str) -> Callable[[bytes, int], bytes] | None:
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return lambda raw, limit: raw[:limit]
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16).decompress
    if encoding == "deflate":
        return _Deflate().decompress
    return None  # br, zstd, several layers: not asked for, not decoded


class _Deflate:
    """``deflate`` is meant to be zlib-wrapped; some servers send it raw."""

    def __init__(self):
        self._decompressor = zlib.decompressobj()
        self._started = False

    def decompress(self, raw: bytes, limit: int) -> bytes:
        if not self._started:
            self._started = True
            try:
                return self._decompressor.decompress(raw, limit)
            except zlib.error:
                self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._decompressor.decompress(raw, limit)


def _charset(response: httpx.Response) -> str:
    charset = response.charset_encoding or "utf-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        return "utf-8"
    return charset
