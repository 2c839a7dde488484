"""Headless-Chromium check of the Prefect web UI: ``check_prefect_ui``.

The browser (``chromium``), the shared helpers and what all checks have in common (screenshots, also
on failure; waits and ``SETTLE_S``) are in ``support.browser``; the MLflow UI's check is in
``support.mlflow_ui``.

What the Prefect 3.9.1 UI does (``prefect/server/ui``; routes ``/runs/flow-run/:flowRunId``,
``/artifacts/key/:artifactKey``, ``/artifacts/artifact/:artifactId``):

- ``/`` serves the V1 UI (with a "Switch to V2 UI" link, although ``/ui-settings`` says
  ``default_ui: v2``); the routes above are V1's.
- The UI calls the API URL from ``/ui-settings``: ``PREFECT_UI_API_URL``, else ``PREFECT_API_URL``,
  else ``http://<server.api.host>:<server.api.port>/api`` -- ``prefect server start --port N`` does not
  change the latter, so without one of those variables the UI calls port 4200 and shows "Can't
  connect to Server API" (``tests/services.PrefectServer`` sets ``PREFECT_API_URL``).
- The key page shows the artifact's description and a timeline of its versions, not the markdown;
  the markdown is rendered (``h1``..., lists, tables) on the artifact's own page, reached by its link.
- ``GET /api/artifacts/{key}/latest`` answers with the *collection's* id; the artifact's id is
  ``latest_id`` from ``POST /api/artifacts/latest/filter``.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from support.browser import SETTLE_S, api_json, checked_page, click, find_css, settle, visible_text, wait_until

__all__ = ["check_prefect_ui"]


# --------------------------------------------------------------------------- Prefect


def _prefect_api_error(driver: WebDriver) -> str | None:
    """The UI's "Can't connect to Server API at ..." toast (the UI's API URL is wrong), if shown."""
    for el in driver.find_elements(By.XPATH, "//*[contains(text(), \"Can't connect to Server API\")]"):
        return visible_text(el)
    return None


def _prefect_wait(driver: WebDriver, timeout_s: float, what: str, cond: Callable[[WebDriver], Any]) -> Any:
    """``wait_until`` that gives up at once, with the UI's own message, when the UI cannot reach its API."""
    def check(d: WebDriver) -> Any:
        if err := _prefect_api_error(d):
            raise AssertionError(f"{what}: the Prefect UI says '{err}' on {d.current_url} (the server's UI API "
                                 "URL is wrong: start it with PREFECT_API_URL or PREFECT_UI_API_URL = its own /api)")
        return cond(d)
    return wait_until(driver, timeout_s, what, check)


def _check_flow_run_page(driver: WebDriver, base: str, page: dict, *, flow_run_id: str, flow_run_name: str,
                         timeout_s: float) -> None:
    """``/runs/flow-run/{flow_run_id}`` shows ``flow_run_name`` and the state badge ``Completed``."""
    url = f"{base}/runs/flow-run/{flow_run_id}"
    driver.get(url)
    heading = ".page-heading .p-bread-crumbs__crumb"
    try:  # the heading is "Runs / <flow run name>"
        _prefect_wait(driver, timeout_s, "the flow run page's heading", lambda d: len(find_css(d, heading)) >= 2)
    except AssertionError as e:
        known = api_json(f"{base}/api/flow_runs/{flow_run_id}")
        raise AssertionError(f"{e} ({'the API knows this flow run as ' + repr(known.get('name')) if known else 'the API has no flow run ' + flow_run_id})") from None
    names = settle(driver, lambda d: (n := [visible_text(c) for c in find_css(d, heading)]) and flow_run_name in n and n)
    page["heading"] = names or [visible_text(c) for c in find_css(driver, heading)]
    if not names:
        raise AssertionError(f"flow run page heading shows {page['heading']}, not the name '{flow_run_name}' on {url}")
    badge = _prefect_wait(driver, timeout_s, "the flow run's state badge", lambda d: find_css(d, ".page-heading .state-badge"))
    state = settle(driver, lambda d: visible_text(find_css(d, ".page-heading .state-badge")[0]) == "Completed" and "Completed")
    page["state_shown"] = state or visible_text(badge[0])
    if page["state_shown"] != "Completed":
        raise AssertionError(f"flow run '{flow_run_name}' shows state '{page['state_shown']}', not 'Completed' on {url}")


def _check_artifact_key_page(driver: WebDriver, base: str, page: dict, latest: dict | None, *, artifact_key: str,
                             timeout_s: float) -> Any:
    """``/artifacts/key/{artifact_key}`` shows the key and its latest artifact; return the artifact's link."""
    url = f"{base}/artifacts/key/{urllib.parse.quote(artifact_key, safe='')}"
    driver.get(url)
    heading = ".page-heading .p-bread-crumbs__crumb"
    if latest is None:  # the UI renders an empty page for an unknown key: wait for its menu, then report
        _prefect_wait(driver, timeout_s, "the Prefect UI", lambda d: d.find_elements(By.XPATH, "//*[normalize-space(text())='Artifacts' or normalize-space(text())='Dashboard']"))
        settle(driver, lambda d: find_css(d, heading))
        keys = sorted({c.get("key") for c in api_json(f"{base}/api/artifacts/latest/filter", method="POST",
                                                       body={"limit": 50}) or [] if c.get("key")})
        raise AssertionError(f"no artifact with key '{artifact_key}': the page shows "
                             f"{[visible_text(c) for c in find_css(driver, heading)] or 'no artifact'} (keys on the server: {keys}) on {url}")
    _prefect_wait(driver, timeout_s, f"artifact key '{artifact_key}' in the page heading",
                  lambda d: [c for c in find_css(d, heading) if visible_text(c) == artifact_key])
    link = _prefect_wait(driver, timeout_s, f"the latest '{artifact_key}' artifact in the timeline",
                         lambda d: find_css(d, f"a[href*='/artifacts/artifact/{latest['latest_id']}']"))[0]
    page["description"] = latest.get("description")
    page["artifact_id"] = latest["latest_id"]
    page["url"] = driver.current_url
    return link


def _check_artifact_page(driver: WebDriver, page: dict, latest: dict, *, artifact_key: str, flow_run_name: str,
                         timeout_s: float, artifact_text: str | None) -> None:
    """The artifact's own page renders its markdown (``artifact_text`` or its first heading) and names the flow run."""
    rendered = _prefect_wait(driver, timeout_s, f"the rendered markdown of artifact '{artifact_key}'",
                             lambda d: find_css(d, ".artifact-data-view .markdown-renderer"))[0]
    markdown = latest.get("data") or ""
    heading = next((m.group(1).strip() for m in re.finditer(r"(?m)^#{1,6}\s+(.+?)\s*#*\s*$", markdown)), None)
    want = artifact_text or heading
    headings = [visible_text(h) for h in find_css(rendered, "h1, h2, h3, h4, h5, h6")]
    page["headings"] = headings
    page["type"] = latest.get("type")
    if want is None:
        raise AssertionError(f"artifact '{artifact_key}' has no markdown heading to look for "
                             f"(type {latest.get('type')}) and no artifact_text was given; on {driver.current_url}")
    try:
        WebDriverWait(driver, SETTLE_S, 0.2).until(lambda d: want in headings or want in visible_text(rendered))
    except TimeoutException:
        raise AssertionError(f"artifact '{artifact_key}': '{want}' is not rendered (headings {headings}) "
                             f"on {driver.current_url}") from None
    page["text_found"] = want
    page["rendered_as_heading"] = want in headings
    if artifact_text is None and not page["rendered_as_heading"]:
        raise AssertionError(f"artifact '{artifact_key}': markdown heading '{want}' is not rendered as a heading "
                             f"(headings {headings}) on {driver.current_url}")
    _prefect_wait(driver, timeout_s, "the artifact's flow run link", lambda d: find_css(d, "a[href*='/runs/flow-run/']"))

    def named(d: WebDriver) -> list[str]:
        return sorted({visible_text(a) for a in find_css(d, "a[href*='/runs/flow-run/']") if visible_text(a)})

    # the link renders first and its name when the UI's own flow-run request answers (seen empty in CI: a
    # lone icon on the screenshot), so wait for the name, not only for the link
    try:
        WebDriverWait(driver, timeout_s, 0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: flow_run_name in named(d))
    except TimeoutException:
        pass
    page["flow_runs_named"] = named(driver)
    if flow_run_name not in page["flow_runs_named"]:
        raise AssertionError(f"artifact '{artifact_key}' names flow run(s) {page['flow_runs_named']}, not "
                             f"'{flow_run_name}', on {driver.current_url}")


def check_prefect_ui(driver: WebDriver, base_url: str, *, flow_run_id: str, flow_run_name: str, artifact_key: str,
                     screens: Path, timeout_s: float = 60, artifact_text: str | None = None) -> dict:
    """Check the pipeline's flow run and report artifact in the Prefect UI at ``base_url``
    (``http://host:port``; a trailing ``/api`` is dropped).

    1. ``/runs/flow-run/{flow_run_id}`` shows ``flow_run_name`` and the state badge ``Completed``.
    2. ``/artifacts/key/{artifact_key}`` shows the key and its latest artifact; a click on it opens
       ``/artifacts/artifact/{id}``, where the markdown is rendered: ``artifact_text`` (default: the
       first heading of the artifact's markdown, read from the API) must be a rendered heading or
       line, and the page must name the flow run ``flow_run_name``.

    The server must give its UI a reachable API URL (``PREFECT_API_URL`` or ``PREFECT_UI_API_URL`` in
    the server's environment; ``--port`` alone leaves the UI calling port 4200): the check fails at
    once, saying so, when the UI shows "Can't connect to Server API".

    Returns:
        ``{"seconds", "prefect-flow-run": {...}, "prefect-artifact-key": {...}, "prefect-artifact": {...}}``.

    Raises:
        AssertionError: something is not on its page (the message names it, the URL and the screenshot).
    """
    t0 = time.monotonic()
    base = base_url.rstrip("/").removesuffix("/api")
    screens = Path(screens)
    screens.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {}

    with checked_page(driver, screens, "prefect-flow-run.png", found) as page:
        _check_flow_run_page(driver, base, page, flow_run_id=flow_run_id, flow_run_name=flow_run_name,
                             timeout_s=timeout_s)

    # the latest artifact of the key (its id: the key page links it); /api/artifacts/{key}/latest
    # answers with the collection's id instead, so ask the collections filter for latest_id
    latest = next(iter(api_json(f"{base}/api/artifacts/latest/filter", method="POST",
                                 body={"artifacts": {"key": {"any_": [artifact_key]}}, "limit": 1}) or []), None)
    with checked_page(driver, screens, "prefect-artifact-key.png", found) as page:
        link = _check_artifact_key_page(driver, base, page, latest, artifact_key=artifact_key, timeout_s=timeout_s)
    click(driver, link)
    with checked_page(driver, screens, "prefect-artifact.png", found) as page:
        _check_artifact_page(driver, page, latest, artifact_key=artifact_key, flow_run_name=flow_run_name,
                             timeout_s=timeout_s, artifact_text=artifact_text)
    found["seconds"] = round(time.monotonic() - t0, 1)
    return found
