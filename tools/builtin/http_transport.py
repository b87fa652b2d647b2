"""How the HTTP tools reach a checked destination: dial the addresses the
guard checked, and read a bounded amount of the answer.

The connection is made by httpcore, as for any httpx client, except that its
network backend dials the ``Destination``'s checked addresses instead of
resolving the host name again. Everything above the TCP connection still
sees the URL's host name: the ``Host`` header, TLS SNI and certificate
verification (httpcore starts TLS with ``server_hostname`` set to the origin's
host, not to the address dialled).

Each exchange also has a ``Deadline``: every connect, TLS handshake, write
and read is bounded by its own timeout and by what remains of the deadline,
so an answer trickled in a byte at a time ends with a read timeout when the
deadline passes, even where no SIGALRM can stop the tool (a web thread).
"""

import codecs
import functools
import os
import ssl
import time
import zlib

import httpcore
import httpx

from tools.builtin.http_guard import Destination, canonical_host

#: Enough decoded bytes for ``MAX_BODY_CHARS`` characters of any UTF-8 text.
MAX_BODY_CHARS = 64_000
MAX_BODY_BYTES = 4 * MAX_BODY_CHARS
#: Only what ``read_capped`` can decompress with its output bounded.
ACCEPT_ENCODING = "gzip, deflate"


class Deadline:
    """A monotonic time by which one exchange must be over."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._ends_at = time.monotonic() + seconds

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self._ends_at

    def bound(self, timeout: float | None, failure: type[httpcore.TimeoutException]) -> float:
        """``timeout`` shrunk to what remains; raises ``failure`` once nothing does."""
        remaining = self._ends_at - time.monotonic()
        if remaining <= 0:
            raise failure(f"the exchange ran past its deadline of {self.seconds:g}s")
        return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the exchange's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: Deadline):
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes, timeout=None):
        return self._stream.read(max_bytes, self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer, timeout=None):
        self._stream.write(buffer, self._deadline.bound(timeout, httpcore.WriteTimeout))

    def close(self):
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        timeout = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        stream = self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _DeadlineStream(stream, self._deadline)

    def get_extra_info(self, info):
        return self._stream.get_extra_info(info)


class _PinnedBackend(httpcore.SyncBackend):
    """Connects only to the destination the guard checked, at its checked
    addresses (in the resolver's order, the next one if one refuses), by the
    deadline."""

    def __init__(self, destination: Destination, deadline: Deadline):
        self._destination = destination
        self._deadline = deadline
        #: Set once a TCP connection is made: until then nothing can have been sent.
        self.connected = False

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        # httpcore names the origin as the URL spells it ([0::1], [FD00::5]);
        # the guard checked its canonical form.
        if (canonical_host(host), port) != (self._destination.host, self._destination.port):
            # Not reachable through the guard's API; a second line of defence
            # should httpx ever name an origin other than the checked URL's.
            raise httpcore.ConnectError(f"{host}:{port} was not checked by the guard")
        failure = None
        for address in self._destination.addresses:
            try:
                stream = super().connect_tcp(
                    str(address),
                    port,
                    self._deadline.bound(timeout, httpcore.ConnectTimeout),
                    local_address,
                    socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:  # nothing sent
                failure = error
            else:
                self.connected = True
                return _DeadlineStream(stream, self._deadline)
        raise failure


class PinnedTransport(httpx.HTTPTransport):
    """An ``httpx.HTTPTransport`` whose connections dial ``destination`` and
    end by ``deadline``; ``connected`` says whether one was made.

    httpx 0.28 does not take an httpcore network backend (encode/httpx#3749
    proposes it), so the pool its transport built is replaced by one with the
    pinned backend; ``handle_request`` — the httpx ↔ httpcore mapping of
    requests, responses and exceptions — is httpx's own. httpcore is pinned
    in requirements.txt for this, and the tests dial names only the test's
    resolver knows, so a pool that resolved by itself would fail them.
    """

    def __init__(self, destination: Destination, deadline: Deadline):
        context = ssl_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        super().__init__(verify=context, trust_env=False)
        self._backend = _PinnedBackend(destination, deadline)
        self.deadline = deadline
        self._pool = httpcore.ConnectionPool(ssl_context=context, network_backend=self._backend)

    @property
    def connected(self) -> bool:
        return self._backend.connected


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
    here, corrupt, or whose compressed stream stops before its end, is shown
    as far as it decoded, marked truncated. Decoding the text never raises: a
    charset that is not a character set (``hex``, ``base64``) is read as UTF-8.
    """
    decoder = _decoder(response.headers.get("content-encoding", ""))
    body = bytearray()
    complete = decoder is not None
    if decoder is not None:
        for raw in response.iter_raw():
            try:
                body += decoder.decompress(raw, MAX_BODY_BYTES + 1 - len(body))
            except zlib.error:
                complete = False
                break
            if len(body) > MAX_BODY_BYTES:
                complete = False
                break
        complete = complete and decoder.ended
    text = _text(bytes(body[:MAX_BODY_BYTES]), response)
    return text[:MAX_BODY_CHARS], not complete or len(text) > MAX_BODY_CHARS


class _Identity:
    ended = True

    def decompress(self, raw: bytes, limit: int) -> bytes:
        return raw[:limit]


def _decoder(content_encoding: str) -> "_Identity | _Gzip | _Deflate | None":
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return _Identity()
    if encoding in ("gzip", "x-gzip"):
        return _Gzip()
    if encoding == "deflate":
        return _Deflate()
    return None  # br, zstd, several layers: not asked for, not decoded


class _Gzip:
    """A gzip body, every member of it: RFC 1952 lets members follow one
    another, and ``gzip -c a b`` (or a server appending) makes such a body.
    ``ended`` once the last member read so far is complete."""

    def __init__(self):
        self._member = zlib.decompressobj(zlib.MAX_WBITS | 16)

    @property
    def ended(self) -> bool:
        return self._member.eof

    def decompress(self, raw: bytes, limit: int) -> bytes:
        output = self._member.decompress(raw, limit)
        # ``limit`` stays at least 1: a max_length of 0 would mean no limit.
        while self._member.eof and self._member.unused_data and len(output) < limit:
            following = self._member.unused_data
            self._member = zlib.decompressobj(zlib.MAX_WBITS | 16)
            try:
                output += self._member.decompress(following, limit - len(output))
            except zlib.error:
                # Not a gzip member after all (trailing garbage): keep what
                # decoded; the fresh member never ends, so the body is cut.
                break
        return output


class _Deflate:
    """``deflate`` is meant to be zlib-wrapped; some servers send it raw."""

    def __init__(self):
        self._decompressor = zlib.decompressobj()
        self._started = False

    @property
    def ended(self) -> bool:
        return self._decompressor.eof

    def decompress(self, raw: bytes, limit: int) -> bytes:
        if not self._started:
            self._started = True
            try:
                return self._decompressor.decompress(raw, limit)
            except zlib.error:
                self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._decompressor.decompress(raw, limit)


#: Text codecs Python has that are not a body's character set: ``idna`` and
#: ``undefined`` refuse ``errors="replace"``, the escape codecs warn.
_NOT_CHARSETS = {"idna", "punycode", "undefined", "unicode-escape", "raw-unicode-escape"}


def _text(data: bytes, response: httpx.Response) -> str:
    try:
        return data.decode(_charset(response), errors="replace")
    except (LookupError, ValueError):  # should a codec still refuse: never an error here
        return data.decode("utf-8", errors="replace")


def _charset(response: httpx.Response) -> str:
    """The answer's charset if it is a character set Python decodes, else UTF-8."""
    try:
        codec = codecs.lookup(response.charset_encoding or "utf-8")
    except LookupError:
        return "utf-8"
    # hex, base64, rot13, zlib, uu: bytes-to-bytes or str-to-str transforms
    if not codec._is_text_encoding or codec.name in _NOT_CHARSETS:
        return "utf-8"
    return codec.name
