"""Headless-Chromium checks of the MLflow and Prefect web UIs, as a reviewer would see them.

This module holds the browser (``chromium``) and the generic helpers both checks use (``api_json``,
``wait_until``, ``settle``, ``checked_page``, ...); the checks themselves are in ``support.mlflow_ui``
(``check_mlflow_ui``) and ``support.prefect_ui`` (``check_prefect_ui``), whose docstrings say what
each UI does.

Not a test module (no ``test_`` prefix): the ``services`` tests import it after the pipeline ran
against real ``mlflow server`` / ``prefect server`` processes. It drives Debian's Chromium through
Selenium (``/usr/bin/chromium`` + ``/usr/bin/chromedriver``, both given explicitly so Selenium
Manager never runs or downloads anything) and checks that the pipeline's results are *on the
rendered pages*, not only in the APIs:

- ``chromium(screens)``: a context manager that starts a fresh headless browser (own profile in a
  temp dir, 1600x1100 window) and always quits it.
- ``mlflow_ui.check_mlflow_ui(...)``: the experiment's runs table (parent run, metric column,
  Dataset and Models columns), the parent run's page (metric, datasets, logged model) and the
  registered model's page (a version with the alias) in MLflow 3.17.2's UI.
- ``prefect_ui.check_prefect_ui(...)``: the flow run's page (name, ``Completed``) and the report
  artifact (key page, then the artifact itself with its markdown rendered) in Prefect 3.9.1's UI.

The APIs are used only to look up ids that the page URLs need (experiment id, child runs of the
parent, latest artifact of a key) and to make failure messages say what the server holds.

Every checked page is saved as a PNG in ``screens`` (``mlflow-experiment-landing.png``,
``mlflow-experiment-runs.png``, ``mlflow-run.png``, ``mlflow-registered-model.png``,
``prefect-flow-run.png``, ``prefect-artifact-key.png``, ``prefect-artifact.png``; plus
``mlflow-experiment-runs-datasets.png`` / ``mlflow-run-datasets.png`` when a dataset list had to be
opened), also when a check fails: the screenshot is saved first, then ``AssertionError`` is raised,
its message naming what was missing, on which URL, and the screenshot. Waits are ``WebDriverWait`` on
rendered text/elements, never fixed sleeps; once a page has rendered, an expected item gets
``SETTLE_S`` more seconds, so a failing check fails in seconds rather than after ``timeout_s``.
The checks change the browser's UI state as a reviewer's clicks would (MLflow keeps the switch,
ticked columns and expanded runs in localStorage), so a second check in the same browser may find
the runs table already showing them; the returned dict says so.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

__all__ = [
    "API_TIMEOUT_S", "CHROMEDRIVER", "CHROMIUM", "CHROMIUM_FLAGS", "SETTLE_S",
    "api_json", "checked_page", "chromium", "click", "find_css", "press_escape", "screenshot", "settle",
    "visible_text", "wait_until", "window_height", "xpath_literal",
]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1600,1100",
)
SETTLE_S = 5.0  # once a page has rendered, how long something that should be on it may still take
API_TIMEOUT_S = 15.0


# --------------------------------------------------------------------------- browser


@contextmanager
def chromium(screens: Path) -> Iterator[WebDriver]:
    """A headless Chromium (Selenium ``WebDriver``) with a fresh profile; always quit on exit.

    ``screens`` (created here) is where the checks save their screenshots. Raises
    ``FileNotFoundError`` when Debian's ``chromium`` / ``chromium-driver`` are not installed.
    """
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not Path(binary).is_file():
            raise FileNotFoundError(f"{binary} not found (apt-get install chromium chromium-driver)")
    Path(screens).mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="aiayn-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = None
    try:
        # the driver path given here is what keeps Selenium Manager from running at all
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        if driver is not None:
            try:
                driver.quit()
            except WebDriverException:
                pass
        shutil.rmtree(profile, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


def api_json(url: str, *, method: str = "GET", body: dict | None = None, missing: tuple[int, ...] = (404,)) -> Any:
    """JSON of ``url``; ``None`` on an HTTP status in ``missing`` (other errors raise)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=API_TIMEOUT_S) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        if e.code in missing:
            return None
        raise


def xpath_literal(s: str) -> str:
    if "'" not in s:
        return f"'{s}'"
    if '"' not in s:
        return f'"{s}"'
    return "concat(" + ", \"'\", ".join(f"'{p}'" for p in s.split("'")) + ")"


def visible_text(el: WebElement) -> str:
    """Visible text of ``el`` on one line (``textContent`` when Selenium sees none, e.g. scrolled away)."""
    t = el.text or el.get_attribute("textContent") or ""
    return " ".join(t.split())


def wait_until(driver: WebDriver, timeout_s: float, what: str, cond: Callable[[WebDriver], Any]) -> Any:
    """Wait until ``cond(driver)`` is truthy; ``AssertionError`` naming ``what`` and the URL otherwise."""
    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(cond)
    except TimeoutException:
        raise AssertionError(f"{what}: not shown after {timeout_s:g} s on {driver.current_url}") from None


def settle(driver: WebDriver, cond: Callable[[WebDriver], Any]) -> Any:
    """``cond(driver)`` once it is truthy within ``SETTLE_S`` (the page has rendered already), else None."""
    try:
        return WebDriverWait(driver, SETTLE_S, poll_frequency=0.2,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException,
                                                 IndexError)).until(cond)
    except TimeoutException:
        return None


def find_css(driver: WebDriver | WebElement, css: str) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, css)


def click(driver: WebDriver, el: WebElement) -> None:
    """Scroll ``el`` into view and click it like a user; a JS click when an overlay is in the way."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'});", el)
    try:
        el.click()
    except WebDriverException:  # e.g. ElementClickInterceptedException by a transient popover
        driver.execute_script("arguments[0].click();", el)


@contextmanager
def checked_page(driver: WebDriver, screens: Path, png: str, found: dict) -> Iterator[dict]:
    """Run one page's checks; save ``screens/png`` afterwards, also when they fail (then re-raise).

    Yields the dict for this page (``url`` and ``screenshot`` are filled in); stored under
    ``found[png stem]``. Selenium errors while driving the page become ``AssertionError`` too.
    """
    path = Path(screens) / png
    page: dict[str, Any] = {"screenshot": str(path)}
    found[path.stem] = page
    try:
        yield page
    except AssertionError as e:
        screenshot(driver, path)
        raise AssertionError(f"{e} [screenshot: {path}]") from None
    except WebDriverException as e:
        screenshot(driver, path)
        msg = (e.msg or str(e)).splitlines()[0] if (e.msg or str(e)) else ""
        raise AssertionError(f"{type(e).__name__} while checking {driver.current_url}: {msg} "
                             f"[screenshot: {path}]") from None
    except Exception:
        screenshot(driver, path)
        raise
    else:
        page["url"] = driver.current_url
        screenshot(driver, path)


def screenshot(driver: WebDriver, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
    except WebDriverException:
        pass


@contextmanager
def window_height(driver: WebDriver, height: int) -> Iterator[None]:
    """A taller window meanwhile (the run page's metrics, params and logged models in one screenshot)."""
    size = driver.get_window_size()
    try:
        driver.set_window_size(size["width"], height)
    except WebDriverException:
        pass
    try:
        yield
    finally:
        try:
            driver.set_window_size(size["width"], size["height"])
        except WebDriverException:
            pass


def press_escape(driver: WebDriver) -> None:
    """Press Escape on the focused element (closes popovers). Best effort."""
    try:
        driver.switch_to.active_element.send_keys(Keys.ESCAPE)
    except WebDriverException:
        pass
