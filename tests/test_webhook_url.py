"""The one scrubbing of a webhook's URL (``runs.approvals.webhook_url``), on
its own: every secret part, in each form a receiver or an error may write
it, and the origin left readable. The webhooks' own tests show it applied
to every log line and stored error (tests/test_webhook_receivers.py)."""

import base64

import pytest

from runs.approvals.webhook_url import origin, scrubbed

URL = "https://hooks.example.org:8443/services/T0Team/B0%2Fbot?token=tok%2BSECRET&team=ops#frag-SECRET"


@pytest.mark.parametrize(
    "echoed",
    [
        URL,
        "tok%2BSECRET",  # the query value as the URL holds it
        "tok+SECRET",  # decoded
        "tok%2bSECRET",  # encoded again, lower-case hex
        "tok%252BSECRET",  # as held, encoded again (the URL quoted in a link)
        "B0%252Fbot",
        "B0%2Fbot",  # a path segment as held
        "B0/bot",  # decoded
        '"B0\\/bot"',  # JSON-escaped
        "T0Team",
        "T0TEAM",  # a token differing in case only
        "frag-SECRET",
    ],
)
def test_each_secret_part_is_hidden_in_every_form(echoed):
    shown = scrubbed(f"answered 403: unknown {echoed}, try again", URL)
    assert shown.startswith("answered 403: unknown ") and shown.endswith(", try again")
    for secret in ("secret", "t0team", "bot"):
        assert secret not in shown.lower(), shown


def test_the_origin_stays_readable_and_short_parts_are_left():
    """A part shorter than four characters is no credential: ``ops`` is
    left, and so is ``hooks`` inside the host though a segment is called so."""
    url = "https://hooks.example.org/hooks/a1/tok-SECRET?team=ops"
    shown = scrubbed(f"refused {url!r}: hooks.example.org:443 said hooks a1 team=ops", url)
    assert (
        shown == "refused 'https://hooks.example.org/…': hooks.example.org:443 said … a1 team=ops"
    )
    assert origin(url) == "https://hooks.example.org/…"


def test_a_secret_holding_the_host_is_hidden_whole():
    url = "https://hooks.test/xhooks.testy"
    assert scrubbed("a xhooks.testy at hooks.test", url) == "a … at hooks.test"


def test_user_info_is_hidden():
    url = "https://robot:pw-SECRET@hooks.test/"
    assert scrubbed("robot pw-SECRET", url) == "… …"


def test_user_info_is_hidden_as_basic_credentials():
    """As the HTTP client sends it: the base64 of the decoded ``user:password``."""
    url = "https://robot:pw%40SECRET@hooks.test/"
    basic = base64.b64encode(b"robot:pw@SECRET").decode()
    assert scrubbed(f"refused Basic {basic}", url) == "refused Basic …"
