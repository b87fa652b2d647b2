"""What the browser tests share: Debian's chromium driven by Playwright,
where the manual's screenshots live (the ``screenshots`` fixture in
conftest.py), and an admin page logged in as one of the cast."""

import contextlib
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

DOCS_SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def admin_page(base_url: str, username: str, password: str = "pw", *, viewport=(1440, 900)):
    """A chromium page (``viewport``: width, height) logged into the admin
    at ``base_url`` as ``username``; the browser is closed as the block ends."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            width, height = viewport
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(f"{base_url}/admin/login/")
            page.fill("#id_username", username)
            page.fill("#id_password", password)
            page.click("input[type=submit]")
            expect(page.locator("#site-name")).to_be_visible()
            yield page
        finally:
            browser.close()
