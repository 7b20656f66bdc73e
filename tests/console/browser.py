"""A headless Debian ``chromium`` driven by Selenium through the system
``chromedriver`` (``make test`` installs both with apt; Selenium never downloads
a browser or a driver here: both paths are given).

Screenshots go to ``ARTIFACTS`` (``$HEADRACE_TEST_ARTIFACTS/console``, by default
``test-artifacts/console`` in the checkout), one PNG per step, named after the
test: a reviewer sees what the browser saw.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.wait import WebDriverWait

from tests._server import ROOT

CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMEDRIVER: Final = Path("/usr/bin/chromedriver")
ARTIFACTS: Final = (
    Path(os.environ.get("HEADRACE_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"
)

PAGE_TIMEOUT_S: Final = 30.0
"""Bound on loading a page or running a script (a cold browser on two busy cores)."""
WAIT_S: Final = 20.0
"""Bound on waiting for what the page shows (it refreshes every 2 s)."""

T = TypeVar("T")


@contextmanager
def browser(profile: Path, *, insecure_tls: bool = False) -> Iterator[WebDriver]:
    """A headless chromium with its own profile directory, quit at the end."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests run as root, where chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1100",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    if insecure_tls:
        options.add_argument("--ignore-certificate-errors")  # the test's self-signed certificate
    service = Service(str(CHROMEDRIVER), log_output=str(profile.with_suffix(".chromedriver.log")))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_page_load_timeout(PAGE_TIMEOUT_S)
        driver.set_script_timeout(PAGE_TIMEOUT_S)
        yield driver
    finally:
        driver.quit()


def wait_until(driver: WebDriver, condition: Callable[[WebDriver], T], what: str) -> T:
    """``condition``'s first truthy result within ``WAIT_S``; fails naming ``what``."""
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
        condition, message=f"the console did not show {what} within {WAIT_S:.0f} s"
    )


def screenshot(driver: WebDriver, test: str, step: str) -> Path:
    """Save what the browser shows as ``ARTIFACTS/<test>-<step>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', test)}-{step}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot saved to {path}"
    return path
