"""A real browser for the pages a person looks at: Debian's chromium, headless, driven by Selenium
through chromedriver.

``python3 dev.py test`` installs ``chromium`` and ``chromium-driver`` where they are missing (as
root); elsewhere the browser tests are skipped, saying why. Every test that uses the ``browser``
fixture can keep screenshots with ``browser.keep(name)``: PNG files in ``TEST_ARTEFACTS_DIR``
(default ``artefacts/screenshots`` in the checkout), kept after the run for a person to look at.
"""

import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTEFACTS = Path(os.environ.get("TEST_ARTEFACTS_DIR") or ROOT / "artefacts") / "screenshots"


def chromium_paths():
    """``(browser, driver)`` of the machine, or ``None`` where one is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


class Browser:
    """A thin layer over the WebDriver: open a page, find what a person sees, keep a picture."""

    def __init__(self, driver, test_name):
        self.driver = driver
        self.test_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", test_name)[:120]

    def get(self, url):
        self.driver.get(url)
        return self

    def text(self):
        return self.driver.find_element("tag name", "body").text

    def find(self, css):
        return self.driver.find_element("css selector", css)

    def find_all(self, css):
        return self.driver.find_elements("css selector", css)

    def keep(self, name):
        """Save a screenshot of the whole page as an artefact of the run; returns its path."""
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        height = self.driver.execute_script("return Math.max(document.documentElement.scrollHeight, 800)")
        self.driver.set_window_size(1400, min(int(height), 6000))
        path = ARTEFACTS / f"{self.test_name}--{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def log_in(self, base_url, username, password):
        """Log in through the admin's own login form, as a person does."""
        self.get(f"{base_url}/admin/login/")
        self.find("#id_username").send_keys(username)
        self.find("#id_password").send_keys(password)
        self.find("input[type=submit]").click()
        self.wait_for(lambda driver: "/login/" not in driver.current_url)
        return self

    def wait_for(self, condition, seconds=20):
        """Wait until ``condition(driver)`` is true (a page loading after a click)."""
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, seconds).until(condition)


@pytest.fixture
def browser(request):
    paths = chromium_paths()
    if paths is None:
        pytest.skip("chromium and chromedriver are not installed (python3 dev.py test installs them as root)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:  # pragma: no cover - selenium is a dev dependency
        pytest.skip("selenium is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=paths[1]), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield Browser(driver, request.node.name)
    finally:
        driver.quit()
