"""The web console in a real headless browser (Debian chromium, through Selenium and
chromedriver) against a real ``headrace serve``: the pages load, the numbers shown
are the API's, a live tail shows an event written during the test, and with TLS and
auth on an admin logs in. Screenshots: ``tests/console/browser.py`` (``ARTIFACTS``)."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select

from tests._server import add_user, make_certificate
from tests.console.browser import browser, screenshot, wait_until
from tests.console.conftest import api, group_scenario, produce
from tests.ops.conftest import WAIT_S, free_port, listener_args

pytestmark = pytest.mark.slow

TABLE_JS = """
return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr')).map(row => [
  row.dataset[arguments[1]],
  Object.fromEntries(Array.from(row.querySelectorAll('td[data-field]'),
                                td => [td.dataset.field, td.textContent]))]);
"""


def _shown(driver: WebDriver, table: str, key: str) -> dict[str, dict[str, str]]:
    """The rows of a console table: key -> field -> text shown."""
    return {name: cells for name, cells in driver.execute_script(TABLE_JS, table, key)}


def _text(value: object) -> str:
    return "—" if value is None else str(value)


def _streams_match(driver: WebDriver, api_streams: list[dict[str, Any]]) -> bool:
    shown = _shown(driver, "#streams", "stream")
    expected = {
        s["name"]: {
            "name": s["name"],
            "state": "sealed" if s["sealed"] else "open",
            "segments": _text(s["segments"]),
            "bytes": _text(s["bytes"]),
            "events": _text(s["events"] or 0),
        }
        for s in api_streams
    }
    return set(shown) == set(expected) and all(
        {field: shown[name][field] for field in cells} == cells for name, cells in expected.items()
    )


def _tail_shows_a_new_event(driver: WebDriver, write: Any, stream: str) -> str:
    """Start the tail of ``stream``, then write one event; the text the tail shows."""
    Select(driver.find_element(By.ID, "tail-stream")).select_by_value(stream)
    driver.find_element(By.ID, "tail-start").click()
    wait_until(
        driver,
        lambda d: d.execute_script("return document.body.dataset.tailing") == stream,
        f"the tail of {stream} subscribed",
    )
    marker = f"live {uuid.uuid4().hex}"
    write(marker)
    shown: str = wait_until(
        driver,
        lambda d: next((li.text for li in d.find_elements(By.CSS_SELECTOR, "#tail li")), None),
        "the event written",
    )
    assert shown.startswith(marker), shown
    return shown


def test_console_shows_the_apis_numbers_and_a_live_tail(
    start_serve: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    test = request.node.name
    http, tank, controller, segments = (free_port() for _ in range(4))
    start_serve(*listener_args(http=http, tank=tank, controller=controller, segment_store=segments))
    base = f"http://127.0.0.1:{http}"
    asyncio.run(asyncio.wait_for(produce(tank, {"alpha": 3, "beta": 5}), WAIT_S))
    asyncio.run(
        asyncio.wait_for(group_scenario(f"tcp://127.0.0.1:{controller}", 10, 4), 3 * WAIT_S)
    )
    _, streams, _ = api(base, "/api/streams")
    _, groups, _ = api(base, "/api/groups")
    assert len(streams["streams"]) == 3 and len(groups["groups"]) == 1

    with browser(tmp_path / "chromium") as driver:
        driver.get(base + "/")
        wait_until(
            driver, lambda d: d.execute_script("return document.body.dataset.loaded"), "data"
        )
        assert driver.title == "headrace console"
        wait_until(driver, lambda d: _streams_match(d, streams["streams"]), "the API's streams")
        assert driver.find_element(By.ID, "status").text == "ok"
        assert driver.find_element(By.ID, "store").text == "ok"
        assert driver.find_element(By.ID, "auth").text == "off (read-only)"
        assert not driver.find_elements(By.CSS_SELECTOR, "#streams button")  # no admin here

        (group,) = groups["groups"]
        wait_until(
            driver,
            lambda d: (
                _shown(d, "#groups", "group").get("g/grp")
                == {
                    "name": "g/grp",
                    "streams": "g/s",
                    "readers": str(len(group["readers"])),
                    "segments": "1",
                    "lag": str(group["lag"]),
                }
            ),
            "the group's lag",
        )

        # Connections of the TANK door: none come and go any more, so the numbers hold.
        _, connections, _ = api(base, "/api/connections")
        (door,) = (d for d in connections["doors"] if d["door"] == "tank")
        wait_until(
            driver,
            lambda d: _shown(d, "#connections", "door").get("tank")
            == {key: _text(door[key]) for key in ("port", "open", "accepted", "requests",
                                                  "received_bytes", "sent_bytes")}
            | {"up": "yes"},
            "the TANK door's connections",
        )  # fmt: skip
        screenshot(driver, test, "loaded")

        def write(marker: str) -> None:
            asyncio.run(asyncio.wait_for(produce(tank, {"alpha": 1}, prefix=marker), WAIT_S))

        shown = _tail_shows_a_new_event(driver, write, "tank/alpha")
        assert shown.endswith(" alpha 0")
        screenshot(driver, test, "tail")
        # The tables catch up with the events the tail saw.
        _, streams, _ = api(base, "/api/streams")
        wait_until(driver, lambda d: _streams_match(d, streams["streams"]), "the new counts")


def test_console_over_tls_with_auth_logs_an_admin_in(
    start_serve: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    test = request.node.name
    cert = make_certificate(tmp_path / "tls", "localhost")
    users = tmp_path / "users"
    add_user(users, "admin", "admin-secret", "prn::/,READ_UPDATE")
    http, tank = free_port(), free_port()
    start_serve(
        *listener_args(http=http, tank=tank),
        "--tls-cert", str(cert.cert), "--tls-key", str(cert.key),
        "--auth-password-file", str(users),
        "--auth-trust-unauthenticated", "tank",
    )  # fmt: skip
    context = ssl.create_default_context(cafile=str(cert.cert))
    asyncio.run(
        asyncio.wait_for(produce(tank, {"alpha": 2, "beta": 1}, ssl_context=context), WAIT_S)
    )
    base = f"https://127.0.0.1:{http}"
    status, _, _ = api(base, "/api/streams", cafile=str(cert.cert))
    assert status == 401
    _, streams, _ = api(
        base, "/api/streams", user="admin", password="admin-secret", cafile=str(cert.cert)
    )

    with browser(tmp_path / "chromium", insecure_tls=True) as driver:
        driver.get(base + "/")
        wait_until(driver, lambda d: d.find_element(By.ID, "login").is_displayed(), "the login")
        assert not _shown(driver, "#streams", "stream")  # nothing without credentials
        screenshot(driver, test, "login")
        driver.find_element(By.ID, "user").send_keys("admin")
        driver.find_element(By.ID, "password").send_keys("admin-secret")
        driver.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_until(driver, lambda d: _streams_match(d, streams["streams"]), "the API's streams")
        assert driver.find_element(By.ID, "who-name").text == "admin (admin)"
        assert len(driver.find_elements(By.CSS_SELECTOR, "#streams button")) == 2  # Seal
        screenshot(driver, test, "admin")

        def write(marker: str) -> None:
            asyncio.run(
                asyncio.wait_for(
                    produce(tank, {"alpha": 1}, prefix=marker, ssl_context=context), WAIT_S
                )
            )

        # The tail logs in over wss with the same credentials (RS-IO's auth extension).
        _tail_shows_a_new_event(driver, write, "tank/alpha")
        screenshot(driver, test, "tail")

        # An admin seals a stream from the console.
        def seal_beta(d: WebDriver) -> bool:
            """Click tank/beta's Seal; the table may be redrawn under the click (again)."""
            seal = '#streams tr[data-stream="tank/beta"] button'
            try:
                d.find_element(By.CSS_SELECTOR, seal).click()
            except StaleElementReferenceException:
                return False
            return True

        wait_until(driver, seal_beta, "tank/beta's Seal button")
        driver.switch_to.alert.accept()
        wait_until(
            driver,
            lambda d: _shown(d, "#streams", "stream")["tank/beta"]["state"] == "sealed",
            "tank/beta sealed",
        )
        screenshot(driver, test, "sealed")
