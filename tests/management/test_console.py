"""The web console in a real browser: headless Chromium (Debian's chromium and
chromium-driver, installed by .ci/run) driven by selenium, against a real broker."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from proton import Message

from scow.core.testing import DEFAULT_PLUGINS, wait_for
from tests.wire.helpers import connected, send

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install; .ci/run does)",
)


@pytest.fixture
def browser(tmp_path: Path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium'}")
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def settled(condition):
    """`condition`, read again when the page redrew its tables under it (every second)."""

    def check():
        try:
            return condition()
        except (StaleElementReferenceException, NoSuchElementException):
            return False

    return check


def queue_names(driver) -> list[str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
    return [row.get_attribute("data-name") for row in rows]


def cell(driver, queue: str, column: int) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'#queues tbody tr[data-name="{queue}"]')
    return row.find_elements(By.TAG_NAME, "td")[column].text


def test_console_shows_a_queue_and_purges_it(scow_broker, browser, tmp_path):
    broker = scow_broker(
        plugins=[*DEFAULT_PLUGINS, "management"],
        sections={"management": {"listen": "127.0.0.1:0"}},  # loopback: anonymous allowed
    )
    url = broker.call(lambda: broker.broker.stats()["management"]["url"])
    browser.get(f"{url}/console")
    wait_for(lambda: browser.find_element(By.ID, "version").text, what="the console to load")
    assert "orders" not in queue_names(browser)

    with connected(broker.url) as conn:
        send(conn, "orders", *(Message(body=f"o{i}") for i in range(3)))
    wait_for(settled(lambda: "orders" in queue_names(browser)), what="the queue to appear")
    wait_for(settled(lambda: cell(browser, "orders", 4) == "3"), what="its 3 messages")

    def purge() -> bool:
        row = browser.find_element(By.CSS_SELECTOR, '#queues tbody tr[data-name="orders"]')
        row.find_element(By.CSS_SELECTOR, "button.purge").click()
        return True

    wait_for(settled(purge), what="the purge button to be clicked")
    wait_for(lambda: broker.queue_stats("orders")["message-count"] == 0, what="the purge")
    wait_for(settled(lambda: cell(browser, "orders", 4) == "0"), what="the console to show it")

    shot = tmp_path / "console.png"
    assert browser.save_screenshot(str(shot))
    assert not _blank(shot.read_bytes())


def _blank(png: bytes) -> bool:
    """A PNG of one colour compresses to almost nothing; a page with tables does not."""
    return len(png) < 5_000
