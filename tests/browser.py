"""Debian's Chromium, headless, driven by Playwright: the real browser of the dashboard's tests,
`scripts/screenshots` and `bench.web`.

Playwright's own browser download cannot be used here, so it is pointed at the Chromium that
`scripts/system-deps` installs. Each launch gets a fresh profile (Playwright makes one) and
stays off the network beyond the pages it is sent to.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from playwright.sync_api import Browser, Playwright, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run")


def trusting(certificate: Path) -> tuple[str, ...]:
    """Flags under which Chromium accepts this one server certificate (by its public key) without
    a certificate authority it knows, and still refuses any other."""
    key = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    spki = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return (f"--ignore-certificate-errors-spki-list={base64.b64encode(hashlib.sha256(spki).digest()).decode()}",)


def launch(playwright: Playwright, *flags: str) -> Browser:
    """Debian's Chromium, headless, under a running Playwright (one per process)."""
    if not CHROMIUM.exists():
        raise AssertionError(f"{CHROMIUM} is missing: scripts/system-deps installs Debian's chromium")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=[*FLAGS, *flags])


@contextmanager
def chromium(*flags: str) -> Iterator[Browser]:
    """Playwright and a browser of its own, for a program that needs one browser."""
    with sync_playwright() as playwright:
        browser = launch(playwright, *flags)
        try:
            yield browser
        finally:
            browser.close()
