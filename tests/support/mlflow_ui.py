"""Headless-Chromium check of the MLflow web UI: ``check_mlflow_ui`` and the page checks it runs.

The browser (``chromium``), the shared helpers and what all checks have in common (screenshots, also
on failure; waits and ``SETTLE_S``) are in ``support.browser``; the Prefect UI's check is in
``support.prefect_ui``.

What the MLflow 3.17.2 UI does (read from its bundle, ``mlflow/server/js/build``, and seen here):

- ``#/experiments/{id}`` is a redirect whose target depends on the UI-wide "GenAI | Model training"
  switch at the top of the sidebar, *not* on the experiment's ``mlflow.experimentKind`` tag (a UI
  feature flag, hard-wired on, derives the experiment kind from the switch). The switch comes from
  ``?workflowType=`` in the URL, else the browser's localStorage ``mlflow.workflowType``, else
  ``genai``: a fresh browser lands on the GenAI overview (``#/experiments/{id}/overview/usage``).
  The check records the landing page, then clicks "Model training" as a reviewer would (that
  navigates to ``#/experiments/{id}?workflowType=machine_learning`` and lands on
  ``#/experiments/{id}/runs``); ``require_runs_landing=True`` makes a non-runs landing a failure.
- Metric columns are hidden by default (the default columns are Dataset, Source, Models). The check
  opens "Columns", searches the metric and ticks it, as a reviewer would.
- The Dataset cell shows the first dataset and "+N" (up to three with "Expand rows"); the check
  clicks "+N", which lists the others in a popover (saved as ``mlflow-experiment-runs-datasets.png``).
  The run page's "Datasets" works the same way (``mlflow-run-datasets.png``).
- The Models column lists logged models by their *source run* only (``source_run_id``; the run's
  model outputs are not used, a flag that is off in 3.17.2), shown as ``<registered model> vN`` when
  a registry version points at the model. aiayn's logged model is made by a stage (child) run, so
  the parent row shows "-" and the stage row shows ``aiayn-en-de v1``. The check looks at the parent
  row, then expands the parent's child runs; the result says which row showed it
  (``models_row``, ``models_on_parent_row``). The parent's own run page does list the model under
  "Logged models" (from its model outputs), which is checked there.
- The runs table's metric cell is ellipsised on screen (``36.78912…``) but holds the full value, as
  does the run page; both are compared to 4 significant digits (or the shown precision, if coarser).
  On the run page the metric is typed into "Search metrics" (a long list scrolls inside its box) and
  the window is made taller meanwhile, so that ``mlflow-run.png`` shows the metric, the datasets and
  "Logged models" together.
"""

from __future__ import annotations

import difflib
import math
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium.common.exceptions import StaleElementReferenceException, TimeoutException, WebDriverException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from support.browser import (
    SETTLE_S,
    api_json,
    checked_page,
    click,
    find_css,
    press_escape,
    screenshot,
    settle,
    visible_text,
    wait_until,
    window_height,
    xpath_literal,
)

__all__ = ["LOGGED_MODEL_NAME", "RUN_PAGE_HEIGHT", "check_mlflow_ui"]

LOGGED_MODEL_NAME = "serving_model"  # the name aiayn.tracking gives its MLflow logged model
RUN_PAGE_HEIGHT = 1800  # window height while the MLflow run page is checked (one screenshot shows it all)

_RUN_NAME_COL = "attributes.`Run Name`"
_DATASET_COL = "attributes.`Dataset`"
_MODELS_COL = "attributes.`Models`"


# --------------------------------------------------------------------------- helpers


def _datasets_behind_more(driver: WebDriver, container: WebElement, names: list[str], dataset_name: str,
                          labels: Callable[[WebElement], list[str]], shot: Path) -> tuple[list[str], str | None]:
    """Open the "+N" button of a datasets list (its popover is a ``[role=dialog]``), read the names
    there, screenshot, close. Returns (all names seen, the button's label or None when there is none)."""
    more = [b for b in find_css(container, "button") if re.fullmatch(r"\+\d+", visible_text(b))]
    if not more:
        return names, None
    opened = visible_text(more[0])
    click(driver, more[0])

    def listed(d: WebDriver) -> list[str]:
        return _dataset_names([t for x in find_css(d, "[role=dialog]") for t in labels(x)])

    try:
        WebDriverWait(driver, SETTLE_S, 0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: dataset_name in listed(d))
    except TimeoutException:
        pass
    names = list(dict.fromkeys(names + listed(driver)))
    screenshot(driver, shot)
    press_escape(driver)
    return names, opened


def _same_value(shown: str, expected: float) -> bool:
    """``shown`` (a number as the UI writes it) equals ``expected`` to 4 significant digits, or to the
    precision shown when that is coarser (e.g. ``36.8`` for 36.789)."""
    m = re.search(r"-?\d+(?:\.(\d+))?(?:e[-+]?\d+)?", shown.replace(",", ""), re.IGNORECASE)
    if not m:
        return False
    value = float(m.group(0))
    if expected == 0:
        return abs(value) < 1e-12
    exp10 = math.floor(math.log10(abs(expected)))
    tol = 0.5 * 10 ** (exp10 - 3)
    if "e" not in m.group(0).lower():
        tol = max(tol, 0.5 * 10 ** -len(m.group(1) or ""))
    return abs(value - expected) <= tol * (1 + 1e-9)


def _dataset_labels(root: WebDriver | WebElement) -> list[str]:
    """Texts ``name (digest)`` of the dataset labels under ``root`` (leaf spans only)."""
    out = []
    for span in find_css(root, "span"):
        t = visible_text(span)
        if re.fullmatch(r".+ \([0-9a-fA-F]{6,}\)", t) and not find_css(span, "span") and span.is_displayed():
            out.append(t)
    return out


def _dataset_names(texts: list[str]) -> list[str]:
    """``"train.en (69adfa8e...)"`` -> ``"train.en"`` (the UI writes ``name (digest)``)."""
    return [re.sub(r"\s*\([0-9a-fA-F]{6,}\)$", "", t).strip() for t in texts]


# --------------------------------------------------------------------------- MLflow


def _close_mlflow_assistant(driver: WebDriver) -> None:
    """Close the "MLflow Assistant" side panel (opened by itself on a first visit; it hides a third of
    the page). Best effort: nothing happens when it is not open."""
    xp = ("//*[normalize-space(text())='MLflow Assistant']/ancestor::*[.//button[@aria-label='Close']][1]"
          "//button[@aria-label='Close']")
    for b in driver.find_elements(By.XPATH, xp)[:1]:
        try:
            b.click()
        except WebDriverException:
            pass


def _dismiss_popovers(driver: WebDriver) -> None:
    """Dismiss first-visit guidance popovers ("Got it") that cover the page. Best effort."""
    for b in driver.find_elements(By.XPATH, "//button[normalize-space(.)='Got it']"):
        try:
            b.click()
        except WebDriverException:
            pass


def _run_name(cell: WebElement | None) -> str:
    """Run name in a runs-table "Run Name" cell (without the run's colour chip, e.g. ``#4299e0``)."""
    return re.sub(r"^#[0-9a-fA-F]{6}\s+", "", visible_text(cell)) if cell is not None else ""


def _runs_table_cell(driver: WebDriver, run_id: str, col_id: str) -> WebElement | None:
    cells = find_css(driver, f".ag-row[row-id='{run_id}'] [col-id='{col_id}']")
    return cells[0] if cells else None


def _models_in_cell(cell: WebElement | None, names: tuple[str, ...]) -> str | None:
    """Text of a runs-table Models cell when it shows one of ``names`` (or links a model), else None."""
    if cell is None:
        return None
    text = visible_text(cell)
    links = [a.get_attribute("href") or "" for a in find_css(cell, "a")]
    if any(n in text for n in names) or any("/models/" in h for h in links):
        return text
    return None


def _experiment_landing(driver: WebDriver, base: str, exp_id: str, timeout_s: float, page: dict) -> bool:
    """Open ``#/experiments/{id}`` and wait for its redirect; True when it landed on the runs table."""
    url = f"{base}/#/experiments/{exp_id}"
    driver.get(url)
    prefix = f"#/experiments/{exp_id}/"
    tab = wait_until(driver, timeout_s, f"a page of experiment {exp_id} (after opening {url})",
                lambda d: (d.current_url.split(prefix, 1)[1].split("?")[0] or None) if prefix in d.current_url else None)
    page["landing_url"] = driver.current_url
    page["landing_tab"] = tab
    if tab.startswith("runs"):
        wait_until(driver, timeout_s, "the runs table", lambda d: find_css(d, ".ag-root .ag-row, .ag-overlay-no-rows-wrapper"))
        return True
    # wait for the page to render (a heading in the main area) so that the screenshot shows it
    wait_until(driver, timeout_s, f"the '{tab}' page", lambda d: find_css(d, "main h2, main h1, h2"))
    page["landing_heading"] = visible_text(find_css(driver, "main h2, main h1, h2")[0])
    return False


def _switch_to_model_training(driver: WebDriver, base: str, exp_id: str, timeout_s: float, page: dict) -> None:
    """Click the sidebar's "Model training" switch (a URL with ``?workflowType=machine_learning`` when
    the click cannot be made) and wait for the runs table."""
    _dismiss_popovers(driver)
    switch = driver.find_elements(By.XPATH, "//aside//*[normalize-space(text())='Model training']")
    if switch:
        click(driver, switch[0])
        page["switched_by"] = "click on 'Model training'"
    else:
        driver.get(f"{base}/#/experiments/{exp_id}?workflowType=machine_learning")
        page["switched_by"] = "URL ?workflowType=machine_learning"
    wait_until(driver, timeout_s, "the runs table after switching to 'Model training'",
          lambda d: f"#/experiments/{exp_id}/runs" in d.current_url and find_css(d, ".ag-root"))


def _show_metric_column(driver: WebDriver, metric_key: str, timeout_s: float, run_metrics: str = "") -> str:
    """Make the runs table show the metric column ``metric_key`` via "Columns" (search + tick), as a
    reviewer would; return how (``"shown already"`` / ``"ticked in Columns"``)."""
    col_id = f"metrics.`{metric_key}`"
    if find_css(driver, f".ag-header-cell[col-id='{col_id}']"):
        return "shown already"
    buttons = driver.find_elements(By.XPATH, "//button[normalize-space(.)='Columns']")
    if not buttons:
        raise AssertionError(f"no 'Columns' button above the runs table on {driver.current_url}")
    click(driver, buttons[0])
    search = wait_until(driver, timeout_s, "the column selector ('Search columns')",
                   lambda d: find_css(d, "[role=dialog] input[placeholder='Search columns']"))[0]
    search.send_keys(metric_key)

    def metric_node(d: WebDriver) -> WebElement | None:
        group = None
        for node in find_css(d, "[role=dialog] .du-bois-light-tree-treenode"):
            title = visible_text(node)
            if not title:
                continue
            if not find_css(node, ".du-bois-light-tree-switcher-noop"):  # a group: "Metrics (1)", ...
                group = title
            elif group and group.startswith("Metrics") and title == metric_key:
                return node
        return None

    try:
        node = WebDriverWait(driver, SETTLE_S, 0.2, ignored_exceptions=(StaleElementReferenceException,)).until(metric_node)
    except TimeoutException:
        offered = [visible_text(n) for n in find_css(driver, "[role=dialog] .du-bois-light-tree-treenode") if visible_text(n)]
        raise AssertionError(f"metric '{metric_key}' is not offered by the runs table's 'Columns' selector "
                             f"(its search shows {offered or 'nothing'}{run_metrics}) on {driver.current_url}") from None
    click(driver, find_css(node, ".du-bois-light-tree-checkbox")[0])
    search.send_keys(Keys.ESCAPE)
    wait_until(driver, timeout_s, f"column '{metric_key}' in the runs table",
          lambda d: find_css(d, f".ag-header-cell[col-id='{col_id}']"))
    return "ticked in Columns"


def _check_parent_row(driver: WebDriver, parent_run_id: str, parent_run_name: str, timeout_s: float, page: dict,
                      url: str) -> WebElement | None:
    """Runs table, step 1: the parent run is a row (top level) with its name; return its name cell."""
    try:
        name_cell = wait_until(driver, timeout_s, f"parent run {parent_run_id} as a row of the runs table",
                          lambda d: _runs_table_cell(d, parent_run_id, _RUN_NAME_COL))
    except AssertionError as e:
        rows = [_run_name(c) for c in find_css(driver, f".ag-row [col-id='{_RUN_NAME_COL}']")]
        raise AssertionError(f"{e} (rows shown: {rows})") from None
    if not settle(driver, lambda d: _run_name(_runs_table_cell(d, parent_run_id, _RUN_NAME_COL)) == parent_run_name):
        raise AssertionError(f"runs table: the row of run {parent_run_id} shows '{_run_name(name_cell)}', not the name "
                             f"'{parent_run_name}' on {url}")
    name_cell = _runs_table_cell(driver, parent_run_id, _RUN_NAME_COL)
    page["run_name_shown"] = _run_name(name_cell)
    page["columns_default"] = [h.get_attribute("col-id") for h in find_css(driver, ".ag-header-cell")
                               if (h.get_attribute("col-id") or "").startswith(("attributes.", "metrics.", "params.", "tags."))]
    return name_cell


def _check_metric_cell(driver: WebDriver, base: str, parent_run_id: str, parent_run_name: str, metric_key: str,
                       metric_value: float, timeout_s: float, page: dict, url: str) -> None:
    """Runs table, step 2: the metric's column (hidden by default) shows the parent's value."""
    run = (api_json(f"{base}/api/2.0/mlflow/runs/get?run_id={parent_run_id}") or {}).get("run", {})
    keys = sorted(m["key"] for m in run.get("data", {}).get("metrics", []))
    hint = f"; the run has {len(keys)} metrics, closest: {difflib.get_close_matches(metric_key, keys, n=5, cutoff=0.4)}"
    page["metric_column"] = _show_metric_column(driver, metric_key, timeout_s, hint)
    metric_cell = wait_until(driver, timeout_s, f"the parent run's '{metric_key}' cell",
                        lambda d: _runs_table_cell(d, parent_run_id, f"metrics.`{metric_key}`"))
    driver.execute_script("arguments[0].scrollIntoView({block: 'nearest', inline: 'center'});", metric_cell)
    shown = visible_text(metric_cell)
    page["metric_shown"] = shown
    if not _same_value(shown, metric_value):
        raise AssertionError(f"runs table: '{metric_key}' of run '{parent_run_name}' shows '{shown}', "
                             f"expected {metric_value!r} (to 4 significant digits) on {url}")


def _check_dataset_cell(driver: WebDriver, parent_run_id: str, parent_run_name: str, dataset_name: str,
                        screens: Path, page: dict, url: str) -> None:
    """Runs table, step 3: the Dataset column shows ``dataset_name`` (in the cell, or behind its "+N")."""
    def labels(root: WebElement | None) -> list[str]:
        # the cell keeps all labels in the DOM but shows only the first (more with "Expand rows")
        return [s.get_attribute("title") for s in find_css(root, "span[title]") if s.is_displayed()] if root else []

    cell = _runs_table_cell(driver, parent_run_id, _DATASET_COL)
    names = _dataset_names(labels(cell))
    page["dataset_column"] = "in the cell"
    if dataset_name not in names and cell:
        names, opened = _datasets_behind_more(driver, cell, names, dataset_name, labels,
                                              Path(screens) / "mlflow-experiment-runs-datasets.png")
        if opened:
            page["dataset_column"] = f"in the popover of '{opened}'"
    page["datasets_shown"] = names
    if dataset_name not in names:
        raise AssertionError(f"runs table: Dataset column of run '{parent_run_name}' does not show "
                             f"'{dataset_name}' (shows {names or 'nothing'}) on {url}")


def _check_runs_table(driver: WebDriver, base: str, exp_id: str, *, parent_run_id: str, parent_run_name: str,
                      metric_key: str, metric_value: float, dataset_name: str, model_names: tuple[str, ...],
                      screens: Path, timeout_s: float, page: dict) -> None:
    """The runs table: the parent run's row, its metric, its dataset and the Models column."""
    url = driver.current_url
    _close_mlflow_assistant(driver)
    # 1. the parent run is a row (top level) with its name
    name_cell = _check_parent_row(driver, parent_run_id, parent_run_name, timeout_s, page, url)
    # 2. the metric: its column (hidden by default), the parent's value in it
    _check_metric_cell(driver, base, parent_run_id, parent_run_name, metric_key, metric_value, timeout_s, page, url)
    # 3. the Dataset column: the first dataset(s) and "+N", which opens a popover with the others
    _check_dataset_cell(driver, parent_run_id, parent_run_name, dataset_name, screens, page, url)

    # 4. the Models column: the parent row, else a child row (logged models are listed by source run)
    children = (api_json(f"{base}/api/2.0/mlflow/runs/search", method="POST", body={
        "experiment_ids": [exp_id], "filter": f"tags.mlflow.parentRunId = '{parent_run_id}'", "max_results": 100})
        or {}).get("runs", [])
    child_ids = {r["info"]["run_id"]: r["info"].get("run_name", "") for r in children}

    def model_row(d: WebDriver) -> tuple[str, str] | None:
        for run_id, run_name in ((parent_run_id, parent_run_name), *child_ids.items()):
            if (text := _models_in_cell(_runs_table_cell(d, run_id, _MODELS_COL), model_names)) is not None:
                return run_name, text
        return None

    found = None
    if child_ids:
        expander = find_css(name_cell, "button")
        if expander and not any(_runs_table_cell(driver, c, _RUN_NAME_COL) for c in child_ids):
            click(driver, expander[0])
            wait_until(driver, timeout_s, "the parent run's child runs (after expanding it)",
                  lambda d: all(_runs_table_cell(d, c, _RUN_NAME_COL) for c in child_ids))
    try:
        found = WebDriverWait(driver, timeout_s, 0.2, ignored_exceptions=(StaleElementReferenceException,)).until(model_row)
    except TimeoutException:
        pass
    shown_models = {name: visible_text(c) for run_id, name in ((parent_run_id, parent_run_name), *child_ids.items())
                    if (c := _runs_table_cell(driver, run_id, _MODELS_COL)) is not None}
    page["models_column"] = shown_models
    if found is None:
        raise AssertionError(f"runs table: the Models column shows none of {list(model_names)} for run "
                             f"'{parent_run_name}' or its child runs (shows {shown_models}) on {url}")
    page["models_row"], page["models_shown"] = found
    page["models_on_parent_row"] = found[0] == parent_run_name
    metric_header = find_css(driver, f".ag-header-cell[col-id='metrics.`{metric_key}`']")
    if metric_header:
        driver.execute_script("arguments[0].scrollIntoView({block: 'nearest', inline: 'center'});", metric_header[0])


def _check_run_page(driver: WebDriver, base: str, exp_id: str, *, parent_run_id: str, parent_run_name: str,
                    metric_key: str, metric_value: float, dataset_name: str, logged_model_name: str,
                    screens: Path, timeout_s: float, page: dict) -> None:
    url = f"{base}/#/experiments/{exp_id}/runs/{parent_run_id}"
    driver.get(url)
    wait_until(driver, timeout_s, f"run page title '{parent_run_name}'",
          lambda d: d.find_elements(By.XPATH, f"//h2[normalize-space(.)={xpath_literal(parent_run_name)}]"))
    _close_mlflow_assistant(driver)
    # metric table: a row "<metric link> | <value>"; filtered by its "Search metrics" box as a reviewer
    # would (a long list scrolls inside the box, and the screenshot should show the metric)
    search = find_css(driver, "input[placeholder='Search metrics']")
    if search:
        search[0].send_keys(metric_key)
    row_xp = f"//div[@role='row'][.//a[normalize-space(.)={xpath_literal(metric_key)}]]"
    try:
        row = WebDriverWait(driver, SETTLE_S, 0.2).until(lambda d: d.find_elements(By.XPATH, row_xp))[0]
    except TimeoutException:
        rows = [visible_text(r) for r in driver.find_elements(By.XPATH, "//h4[starts-with(normalize-space(.), 'Metrics')]"
                                                                "/following::div[@role='row'][position() <= 30]")]
        raise AssertionError(f"run page: metric '{metric_key}' not in the Metrics table "
                             f"(rows: {rows}) on {url}") from None
    cells = find_css(row, "[role=cell]")
    # "Metric | Value" (+ "Models" when a logged model carries the metric): take the Value column
    headers = [visible_text(h) for h in driver.find_elements(By.XPATH, "//div[@role='row'][.//*[normalize-space(.)='Value']]"
                                                              "//*[@role='columnheader']")]
    col = headers.index("Value") if "Value" in headers else 1
    shown = visible_text(cells[col]) if len(cells) > col else ""
    page["metric_shown"] = shown
    if not _same_value(shown, metric_value):
        raise AssertionError(f"run page: '{metric_key}' shows '{shown}', expected {metric_value!r} (to 4 significant digits) on {url}")

    # logged models box ("Logged models (N)": an ag-grid with the model name as a link)
    models = wait_until(driver, timeout_s, f"logged model '{logged_model_name}' under 'Logged models'",
                   lambda d: (names := [visible_text(a) for a in find_css(d, ".ag-row [col-id='name'] a[href*='/models/']")])
                   and logged_model_name in names and names)
    page["logged_models"] = models
    page["registered_models"] = sorted({visible_text(a) for a in find_css(driver, "a[href*='#/models/'][href*='/versions/']")})

    # datasets ("About this run" > Datasets: one shown, "+N" opens the rest in a popover)
    ds_xp = "//h4[normalize-space(.)='Datasets']/following-sibling::*[1]"
    box = wait_until(driver, timeout_s, "'Datasets' in 'About this run'", lambda d: d.find_elements(By.XPATH, ds_xp))[0]
    names = _dataset_names(_dataset_labels(box))
    if dataset_name not in names:
        names, opened = _datasets_behind_more(driver, box, names, dataset_name, _dataset_labels,
                                              Path(screens) / "mlflow-run-datasets.png")
        if opened:
            page["datasets_opened"] = opened
    page["datasets_shown"] = names
    if dataset_name not in names:
        raise AssertionError(f"run page: dataset '{dataset_name}' not under 'Datasets' (shows {names}) on {url}")
    # the screenshot: scroll just enough to show the logged model too (below the metrics and params)
    for a in find_css(driver, ".ag-row [col-id='name'] a[href*='/models/']")[:1]:
        driver.execute_script("arguments[0].scrollIntoView({block: 'nearest'});", a)


def _check_registered_model(driver: WebDriver, base: str, *, model_name: str, alias: str, timeout_s: float,
                            page: dict) -> None:
    url = f"{base}/#/models/{urllib.parse.quote(model_name, safe='')}"
    driver.get(url)
    link_css = f"a[href*='#/models/{urllib.parse.quote(model_name, safe='')}/versions/']"
    wait_until(driver, timeout_s, f"registered model '{model_name}' with its versions",
          lambda d: d.find_elements(By.XPATH, f"//h2[contains(normalize-space(.), {xpath_literal(model_name)})]")
          and find_css(d, f"[role=row] {link_css}"))
    _close_mlflow_assistant(driver)

    def aliases_by_version(d: WebDriver) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for row in find_css(d, "[role=row]"):
            links = find_css(row, link_css)
            if links:
                tags = find_css(row, "[role=status][data-component-id*='aliastag' i]")
                out[visible_text(links[0])] = [t.get_attribute("title") or visible_text(t).lstrip("@ ").strip() for t in tags]
        return out

    try:
        WebDriverWait(driver, SETTLE_S, 0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: any(alias in a for a in aliases_by_version(d).values()))
    except TimeoutException:
        pass
    shown = aliases_by_version(driver)
    page["aliases_shown"] = shown
    versions = [v for v, a in shown.items() if alias in a]
    expected = api_json(f"{base}/api/2.0/mlflow/registered-models/alias?"  # 400 when there is no such alias
                         + urllib.parse.urlencode({"name": model_name, "alias": alias}), missing=(400, 404))
    expected_version = (expected or {}).get("model_version", {}).get("version")
    page["alias_version_api"] = expected_version
    if not versions:
        raise AssertionError(f"registered model '{model_name}': no version shows alias '@{alias}' "
                             f"(aliases shown: {shown}; API: {'version ' + expected_version if expected_version else 'no such alias'}) on {url}")
    page["alias_version"] = versions[0]
    if expected_version and versions[0] != f"Version {expected_version}":
        raise AssertionError(f"registered model '{model_name}': '@{alias}' shown on {versions[0]}, the registry says "
                             f"version {expected_version} on {url}")


def check_mlflow_ui(driver: WebDriver, base_url: str, *, experiment_name: str, parent_run_id: str,
                    parent_run_name: str, metric_key: str, metric_value: float, dataset_name: str,
                    model_name: str, alias: str, screens: Path, timeout_s: float = 60,
                    logged_model_name: str = LOGGED_MODEL_NAME, require_runs_landing: bool = False) -> dict:
    """Check the pipeline's results in the MLflow UI at ``base_url`` (e.g. ``http://127.0.0.1:5000``).

    1. ``#/experiments/{id}`` (id looked up by ``experiment_name``): where it lands is recorded; when
       that is not the runs table (MLflow 3.17.2 in a fresh browser: the GenAI overview, see the module
       doc), the "Model training" switch is clicked. ``require_runs_landing=True`` fails instead.
    2. The runs table: row ``parent_run_name``; the ``metric_key`` column (ticked in "Columns") shows
       ``metric_value`` (4 significant digits); the Dataset column lists ``dataset_name``; the Models
       column shows ``logged_model_name`` / ``model_name`` (a registered version of it) on the parent
       row or, after expanding it, on a child row (the logged model's source run).
    3. The run page ``#/experiments/{id}/runs/{parent_run_id}``: the metric and its value, the dataset
       under "Datasets" (opening "+N" if needed), ``logged_model_name`` under "Logged models".
    4. ``#/models/{model_name}``: a version carries the alias ``alias`` (and it is the version the
       registry API names for it).

    Each page is saved in ``screens`` (also on failure). A page gets up to ``timeout_s`` to render and
    load its data; once it has, a missing item fails within ``SETTLE_S`` (5 s). ~5-6 s when all is there.

    Returns:
        ``{"experiment_id", "seconds", "mlflow-experiment-landing": {...}, "mlflow-experiment-runs": {...},
        "mlflow-run": {...}, "mlflow-registered-model": {...}}``, each page with its ``url``,
        ``screenshot`` and what it showed.

    Raises:
        AssertionError: something is not on its page (the message names it, the URL and the screenshot).
    """
    t0 = time.monotonic()
    base = base_url.rstrip("/")
    screens = Path(screens)
    screens.mkdir(parents=True, exist_ok=True)
    exp = api_json(f"{base}/api/2.0/mlflow/experiments/get-by-name?"
                    + urllib.parse.urlencode({"experiment_name": experiment_name}))
    if not exp:
        raise AssertionError(f"experiment '{experiment_name}' not found at {base}")
    exp_id = exp["experiment"]["experiment_id"]
    found: dict[str, Any] = {"experiment_id": exp_id}
    model_names = tuple(dict.fromkeys((logged_model_name, model_name)))

    with checked_page(driver, screens, "mlflow-experiment-landing.png", found) as page:
        on_runs = _experiment_landing(driver, base, exp_id, timeout_s, page)
        page["landing_is_runs_table"] = on_runs
        if not on_runs and require_runs_landing:
            raise AssertionError(f"experiment '{experiment_name}' opens on '{page['landing_tab']}' "
                                 f"({page.get('landing_heading', '')}), not on its runs table: MLflow's UI picks the "
                                 "landing page from its GenAI/Model training switch (?workflowType=, localStorage "
                                 "'mlflow.workflowType'), not from the mlflow.experimentKind tag")
    with checked_page(driver, screens, "mlflow-experiment-runs.png", found) as page:
        if not on_runs:
            _switch_to_model_training(driver, base, exp_id, timeout_s, page)
        _check_runs_table(driver, base, exp_id, parent_run_id=parent_run_id, parent_run_name=parent_run_name,
                          metric_key=metric_key, metric_value=metric_value, dataset_name=dataset_name,
                          model_names=model_names, screens=screens, timeout_s=timeout_s, page=page)
    with window_height(driver, RUN_PAGE_HEIGHT), checked_page(driver, screens, "mlflow-run.png", found) as page:
        _check_run_page(driver, base, exp_id, parent_run_id=parent_run_id, parent_run_name=parent_run_name,
                        metric_key=metric_key, metric_value=metric_value, dataset_name=dataset_name,
                        logged_model_name=logged_model_name, screens=screens, timeout_s=timeout_s, page=page)
    with checked_page(driver, screens, "mlflow-registered-model.png", found) as page:
        _check_registered_model(driver, base, model_name=model_name, alias=alias, timeout_s=timeout_s, page=page)
    found["seconds"] = round(time.monotonic() - t0, 1)
    return found
