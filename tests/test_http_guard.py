"""The HTTP tools reach only allowed hosts and ports, at public addresses or
addresses the operator allowed literally, and dial the address they checked.

Names resolve through the test's own resolver (the ``dns`` fixture), never
the system's or the internet; the servers are local.
"""

import ipaddress
import ssl
import subprocess
import tracemalloc

import pytest

from tests.http_fixture import gzip_bomb, start_http_server
from tools.builtin.http_guard import check_url
from tools.builtin.http_transport import MAX_BODY_CHARS
from tools.contract import ToolContext, ToolError
from tools.registry import get_registry

pytestmark = pytest.mark.django_db

CONTEXT = ToolContext(run_id="r", idempotency_key="k" * 64, attempt=1)


def get(url):
    return get_registry().get("http_get").run({"url": url}, CONTEXT)


def post(url):
    return get_registry().get("post_webhook").run({"url": url, "payload": {"n": 1}}, CONTEXT)


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.5",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "100.64.0.1",
        "224.0.0.1",
        "255.255.255.255",
        "fc00::1",
        "fe80::1",
        "ff02::1",
        "::ffff:10.0.0.5",
        "64:ff9b::a9fe:a9fe",
        "::a00:5",
        "fec0::1",  # deprecated site-local: ipaddress calls it global
        "::ffff:0:a00:5",  # IPv4-translated (SIIT) 10.0.0.5: global to ipaddress too
    ],
)
def test_an_allowed_name_that_resolves_to_a_non_public_address_is_refused(dns, settings, address):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["internal.test"]
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1  # should the guard ever let one through
    dns.add("internal.test", [address])
    for call in (get, post):
        with pytest.raises(ToolError, match=f"internal.test resolves to {address}, "):
            call("http://internal.test/")


def test_an_allowed_name_that_resolves_to_loopback_does_not_reach_the_local_server(
    dns, http_server, settings
):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"internal.test:{http_server.port}"]
    dns.add("internal.test", ["127.0.0.1"])
    for call in (get, post):
        with pytest.raises(
            ToolError,
            match="internal.test resolves to 127.0.0.1, a loopback address; allow the "
            "address itself in NRLLM_HTTP_ALLOWED_HOSTS",
        ):
            call(http_server.url("/ok", host="internal.test"))
    assert http_server.received == []


def test_every_address_a_name_resolves_to_is_checked(dns, http_server, settings):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"mixed.test:{http_server.port}", http_server.host]
    dns.add("mixed.test", ["127.0.0.1", "10.0.0.5"])
    with pytest.raises(ToolError, match="mixed.test resolves to 10.0.0.5, a private address"):
        get(http_server.url("/ok", host="mixed.test"))
    assert http_server.received == []


def test_a_name_is_resolved_once_and_the_checked_address_dialled_keeping_the_host(
    dns, http_server, settings
):
    # Allowed literally, 127.0.0.1 passes the check; every later lookup
    # would answer the metadata address. The name is unknown to the system
    # resolver, so only the checked address can have been dialled.
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"rebind.test:{http_server.port}", http_server.host]
    dns.add("rebind.test", ["127.0.0.1"], ["169.254.169.254"])
    result = post(http_server.url("/hook", host="rebind.test"))
    assert result["status"] == 200
    assert dns.lookups == ["rebind.test"]
    [received] = http_server.received
    assert received.headers["Host"] == f"rebind.test:{http_server.port}"


def test_a_host_without_a_port_allows_only_the_schemes_default_port(dns, http_server, settings):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["hook.test", "127.0.0.1", "other.test:8443"]
    dns.add("hook.test", ["127.0.0.1"])
    for url in [http_server.url("/ok", host="hook.test"), http_server.url("/ok")]:
        with pytest.raises(ToolError, match=f"port {http_server.port} of .* is not allowed"):
            get(url)
    assert http_server.received == []
    dns.add("other.test", ["93.184.215.14"])  # checked, never dialled
    for url, port in [
        ("http://hook.test/", 80),
        ("https://hook.test/", 443),
        ("http://other.test:8443/", 8443),
    ]:
        assert check_url(url).destination.port == port
    for url in ["https://hook.test:80/", "http://other.test/", "https://other.test:443/"]:
        with pytest.raises(ToolError, match="is not allowed"):
            check_url(url)


@pytest.fixture
def ipv6_http_server(settings):
    """A local HTTP server on ::1, allowed as ``[::1]:port``."""
    server = start_http_server(address="::1")
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [server.host]
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.parametrize("spelled", ["[0:0:0:0:0:0:0:1]", "[0::1]", "[::0:1]"])
def test_an_allowed_ipv6_address_is_reached_however_the_url_spells_it(ipv6_http_server, spelled):
    # The guard checks and pins the canonical ::1; httpcore names the origin
    # to the pinned backend as the URL spells it, which must not be refused.
    for call in (get, post):
        assert call(ipv6_http_server.url("/ok", host=spelled))["status"] == 200
    assert len(ipv6_http_server.received) == 2


def test_an_address_allowed_literally_is_allowed_in_its_ipv4_mapped_form(dns, settings):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["mapped.test", "10.0.0.5"]
    dns.add("mapped.test", ["::ffff:10.0.0.5"])
    assert check_url("http://mapped.test/").destination.addresses == (
        ipaddress.ip_address("::ffff:10.0.0.5"),
    )
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["mapped.test", "10.0.0.6"]
    with pytest.raises(
        ToolError, match="resolves to ::ffff:10.0.0.5, an address embedding 10.0.0.5, a private"
    ):
        check_url("http://mapped.test/")


def test_a_redirect_is_resolved_and_checked_again(dns, http_server, settings):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [http_server.host, "metadata.test"]
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    dns.add("metadata.test", ["169.254.169.254"])
    with pytest.raises(ToolError, match="metadata.test resolves to 169.254.169.254, a link-local"):
        get(http_server.url("/redirect-to/http://metadata.test/latest/meta-data/"))
    assert [request.path for request in http_server.received] == [
        "/redirect-to/http://metadata.test/latest/meta-data/"
    ]


def test_a_malformed_allow_list_entry_refuses_naming_it(settings):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["example.org/hooks"]
    with pytest.raises(ToolError, match="entry 'example.org/hooks' is not a host"):
        check_url("http://example.org/hooks")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A CA and a certificate for ``secure.test`` it signed (openssl)."""
    folder = tmp_path_factory.mktemp("tls")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*arguments):
        subprocess.run(["openssl", *arguments], cwd=folder, check=True, capture_output=True)

    ca = ["-subj", "/CN=nrllm test CA", "-addext", "basicConstraints=critical,CA:TRUE"]
    ca += ["-addext", "keyUsage=critical,keyCertSign"]
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", *ca)
    openssl("req", *key, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=secure.test")
    (folder / "leaf.ext").write_text(
        "subjectAltName=DNS:secure.test\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    signed = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "leaf.ext"]
    openssl("x509", "-req", "-in", "leaf.csr", "-out", "leaf.pem", "-days", "2", *signed)
    return folder


@pytest.fixture
def https_server(tls_files, monkeypatch):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files / "leaf.pem", tls_files / "leaf.key")
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_files / "ca.pem"))
    server = start_http_server(tls=context)
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_https_to_a_checked_address_verifies_the_certificate_of_the_name(
    dns, https_server, settings
):
    port = https_server.port
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [
        f"secure.test:{port}",
        f"other.test:{port}",
        f"127.0.0.1:{port}",
    ]
    dns.add("secure.test", ["127.0.0.1"])
    dns.add("other.test", ["127.0.0.1"])
    assert get(https_server.url("/ok", host="secure.test"))["status"] == 200
    assert https_server.server_names == ["secure.test"]
    # The same address by another name: the certificate is not for it.
    with pytest.raises(ToolError, match="CERTIFICATE_VERIFY_FAILED"):
        get(https_server.url("/ok", host="other.test"))
    assert https_server.server_names == ["secure.test", "other.test"]
    assert [request.headers["Host"] for request in https_server.received] == [f"secure.test:{port}"]


def test_a_huge_body_is_cut_at_the_cap_and_the_rest_left_unread(http_server):
    result = get(http_server.url("/huge"))
    assert result["truncated"] is True and len(result["body"]) == MAX_BODY_CHARS
    assert http_server.streamed.wait(timeout=10)
    # 64 MiB offered; the client hung up after the cap and a few socket buffers.
    assert http_server.body_bytes_sent < 16 * 2**20


def test_a_gzip_bomb_is_decompressed_only_up_to_the_cap(http_server):
    gzip_bomb()  # built before measuring
    tracemalloc.start()
    try:
        result = get(http_server.url("/gzip-bomb"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["truncated"] is True and result["body"] == "\0" * MAX_BODY_CHARS
    # 200 MiB once decompressed; what was held is the cap and one network read.
    assert peak < 8 * 2**20, f"peak {peak} bytes"


def test_a_gzip_body_of_several_members_is_decoded_whole(http_server):
    result = get(http_server.url("/gzip-members"))
    assert result["body"] == "first, second" and result["truncated"] is False


def test_a_gzip_stream_cut_short_is_marked_truncated(http_server):
    result = get(http_server.url("/gzip-cut"))
    assert result["truncated"] is True
    assert result["body"].startswith("line 0\nline 1\n")
