"""The web console in a real headless Chromium against a real control service: log in with
the admin token, see a parked model and why, press Retry, see it unparked. Screenshots go
to $LLMGW_TEST_ARTIFACTS (default .llmgw/test-artifacts/) for review."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.cli.client import Client
from llmgw_runtime.store import Store, repo
from tests.support.procs import ROOT, wait_until

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
OOM = "engine exited with code 1: CUDA out of memory while loading the weights"
MIG = "a100-80g-mig-3g.40gb"
# A start that failed as an agent reports it: the cause in the middle of the log tail.
LONG_ERROR = ("start failed: exited with 1; last log lines:\n"
              + "".join(f"llama_model_loader: - kv {i:2d}: general.key_{i} str = value\n"
                        for i in range(30))
              + "error: unknown argument: --flash-attn-bogus\n"
              + "usage: llama-server [options]\nsupported flags: --ctx-size, --threads\n")
TELLING = "start failed: exited with 1: error: unknown argument: --flash-attn-bogus"
PAGES = ("Summary", "Nodes", "Models", "Replicas", "Events")
# A scaled model with a long name, and a placement reason that runs long.
SCALED = ("  - name: scaled-" + "x" * 40 + "\n    source: file:///nowhere/scaled.gguf\n"
          "    engine: llama.cpp\n    profile: {class: cpu}\n    replicas: {min: 1, max: 4}\n")
LONG_REASON = ("no reporting node has a device of class cpu (classes seen: "
               + ", ".join(f"a100-80g-mig-{i}g.{10 * i}gb" for i in range(1, 12)) + ")")


def report_gpu_node(cluster: Cluster, name: str = "gpu-01") -> None:
    """A node with two MIG instances (one unhealthy), as its agent would report it."""
    cred = Client(cluster.control_url, cluster.join_token).post(
        "/api/v1/agent/join", {"node": name})["credential"]
    devices = [{"id": 1000 + i, "uuid": f"MIG-{i}", "card": 0, "mig": i, "class": MIG,
                "memory_total_mb": 40960, "memory_used_mb": 512, "healthy": i == 1,
                "reason": None if i == 1 else "XID 79: fell off the bus"} for i in (1, 2)]
    Client(cluster.control_url, cred).post("/api/v1/agent/report", {
        "node": name, "address": "127.0.0.1", "agent_version": "test", "devices": devices,
        "engines": ["vllm"], "weights": {}, "replicas": []})


def artifacts() -> Path:
    path = Path(os.environ.get("LLMGW_TEST_ARTIFACTS") or ROOT / ".llmgw" / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: `make system-deps` installs the Debian "
                    "packages chromium and chromium-driver this test drives")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1100", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.implicitly_wait(0)
        yield driver
    finally:
        driver.quit()
        process = service.process
        if process is not None and process.poll() is None:
            process.kill()
        assert process is None or process.wait(10) is not None, "chromedriver still runs"


def wait_for(driver: Any, what: str, predicate: Any, timeout: float = 15) -> Any:
    return wait_until(lambda: predicate(driver), timeout, f"{what} (at {driver.current_url})")


def test_log_in_see_a_parked_model_press_retry_see_it_unparked(
        cluster_factory: Any, tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    cluster: Cluster = cluster_factory()
    cluster.start_control({"LLMGW_CONSOLE_REFRESH_S": "30"})
    cluster.apply(tiny_catalog(tmp_path / "tiny.gguf") + SCALED)
    store = Store(cluster.store_url)
    try:
        with store.begin() as conn:
            repo.update_model(conn, "tiny", parked=1, consecutive_failures=5, last_error=OOM)
            repo.add_event(conn, time.time(), "failed", "tiny", LONG_ERROR)
            # long texts in every wide cell of the Models page (issue 28: it scrolled
            # sideways at 1280 px, the autoscaling cell six lines high)
            repo.update_model(conn, "scaled-" + "x" * 40, consecutive_failures=2,
                              last_error=LONG_ERROR, placement_reason=LONG_REASON,
                              scale_state=json.dumps({"high_since": time.time() - 90,
                                                      "blocked": LONG_REASON}))
    finally:
        store.dispose()
    assert cluster.model("tiny")["state"] == "parked"
    report_gpu_node(cluster)
    shots = artifacts()

    browser.get(cluster.control_url + "/")
    wait_for(browser, "the login page", lambda d: "/console/login" in d.current_url)
    assert "Admin token" in browser.page_source
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    wait_for(browser, "the refusal", lambda d: "Login refused" in d.page_source)
    assert "matches no account" in browser.page_source

    browser.find_element(By.ID, "token").send_keys(cluster.admin_token)
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    wait_for(browser, "the summary", lambda d: d.title.startswith("Summary"))
    parked = browser.find_element(By.ID, "parked").text
    assert "tiny" in parked and "CUDA out of memory" in parked, parked
    assert 'http-equiv="refresh" content="30;' in browser.page_source
    summary_png = shots / "console-summary.png"
    assert browser.save_screenshot(str(summary_png))

    cookie = next(c for c in browser.get_cookies() if c["name"] == "llmgw_console")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict", cookie
    assert cookie["path"] == "/console"
    assert "llmgw_console" not in browser.execute_script("return document.cookie")

    assert MIG in browser.find_element(By.ID, "devices").text

    browser.find_element(By.LINK_TEXT, "Nodes").click()
    wait_for(browser, "the nodes page", lambda d: d.title.startswith("Nodes"))
    node = browser.find_element(By.ID, "node-gpu-01").text
    assert "0/mig1" in node and "0/mig2" in node and "unhealthy: XID 79" in node, node
    nodes_png = shots / "console-nodes.png"
    assert browser.save_screenshot(str(nodes_png))

    browser.find_element(By.LINK_TEXT, "Models").click()
    wait_for(browser, "the models page", lambda d: d.title.startswith("Models"))
    row = browser.find_element(By.ID, "model-tiny")
    assert "parked" in row.find_element(By.CSS_SELECTOR, "td.state").text
    row.find_element(By.XPATH, ".//button[text()='Retry']").click()
    wait_for(browser, "the unparked message",
             lambda d: "Model tiny was unparked" in d.page_source)
    row = browser.find_element(By.ID, "model-tiny")
    assert row.find_element(By.CSS_SELECTOR, "td.parked").text == "no"
    assert "parked" not in row.find_element(By.CSS_SELECTOR, "td.state").text
    assert not row.find_elements(By.XPATH, ".//button[text()='Retry']")
    after_png = shots / "console-after-retry.png"
    assert browser.save_screenshot(str(after_png))

    # A laptop (1280 px): the Models page fits without scrolling sideways, the autoscaling
    # cell is a few lines, the long error and reason folded to a line each.
    browser.set_window_size(1280, 900)
    for title in ("Summary", "Models"):
        browser.find_element(By.LINK_TEXT, title).click()
        wait_for(browser, f"the {title} page", lambda d, t=title: d.title.startswith(t))
        wide, seen = browser.execute_script(
            "return [document.documentElement.scrollWidth, "
            "document.documentElement.clientWidth]")
        assert wide <= seen, f"the {title} page scrolls sideways at 1280 px: {wide} > {seen}"
    row = browser.find_element(By.ID, "model-scaled-" + "x" * 40)
    line = browser.execute_script(
        "return parseFloat(getComputedStyle(arguments[0]).lineHeight)", row)
    scaling = row.find_element(By.CSS_SELECTOR, "td.scaling")
    high = browser.execute_script(CONTENT_HEIGHT, scaling)
    assert "(1-4)" in scaling.text and high < 4 * line, (high, scaling.text)
    for cell in row.find_elements(By.CSS_SELECTOR, "td"):
        assert cell.rect["x"] + cell.rect["width"] <= seen, f"{cell.text[:40]} off-screen"
    wide_png = shots / "console-models-1280px.png"
    assert browser.save_screenshot(str(wide_png))
    folds = row.find_elements(By.CSS_SELECTOR, "details.fold > summary")
    assert folds and all(f.is_displayed() and f.size["height"] < 1.5 * line for f in folds)
    browser.set_window_size(1400, 1100)

    model = cluster.model("tiny")
    assert not model["parked"] and model["consecutive_failures"] == 0
    events = cluster.admin.get("/api/v1/events")["events"]
    assert any(e["kind"] == "retry" and e["message"] == "unparked by admin (console)"
               for e in events), events
    for png in (summary_png, nodes_png, after_png):
        assert png.stat().st_size > 10_000
        print(f"console screenshot: {png}")

    # On a phone (390 px): every page fits the width, every nav link can be seen and pressed.
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": False})
    try:
        for title in PAGES:
            for label in PAGES:
                link = browser.find_element(By.LINK_TEXT, label)
                assert link.is_displayed(), f"nav link {label} hidden on {title}"
                assert browser.execute_script(PRESSABLE, link), \
                    f"nav link {label} is cut off or covered at 390 px on {title}"
            browser.find_element(By.LINK_TEXT, title).click()
            wait_for(browser, f"the {title} page", lambda d, t=title: d.title.startswith(t))
            wide, seen = browser.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]")
            assert seen == 390 and wide <= seen, f"{title} scrolls sideways at 390 px: {wide}"
        narrow_png = shots / "console-events-390px.png"
        assert browser.save_screenshot(str(narrow_png))

        # The long error is folded to its telling line, one line high, until opened.
        row = browser.find_element(By.CSS_SELECTOR, "#events tr:has(details.fold)")
        fold = row.find_element(By.CSS_SELECTOR, "details.fold")
        summary = fold.find_element(By.TAG_NAME, "summary")
        full = fold.find_element(By.TAG_NAME, "pre")
        assert fold.get_attribute("open") is None and not full.is_displayed()
        assert browser.execute_script("return arguments[0].textContent", summary) == TELLING
        line = browser.execute_script(
            "return parseFloat(getComputedStyle(arguments[0]).lineHeight)", summary)
        assert summary.rect["height"] < 1.5 * line, summary.rect
        assert row.rect["height"] < 3 * line, "the folded row is taller than a line or two"
        summary.click()
        wait_for(browser, "the whole error", lambda d: full.is_displayed())
        assert "--flash-attn-bogus" in full.text and "kv 29" in full.text
        assert row.rect["height"] > 10 * line           # now the whole text shows
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# The height of an element's content (a table cell is as high as its row).
# The height the element's children take on the page: their boxes, not a range of their
# text, which also spans the lines a clamp hides (a reconcile pass writing a long "no room"
# reason made that 12 lines in a cell that showed 3).
CONTENT_HEIGHT = """
const boxes = Array.from(arguments[0].children).map(e => e.getBoundingClientRect());
return Math.max(...boxes.map(b => b.bottom)) - Math.min(...boxes.map(b => b.top));
"""

# True when the element's centre is inside the window and the element (not something over
# it) is what a tap there would hit.
PRESSABLE = """
const r = arguments[0].getBoundingClientRect();
const x = r.left + r.width / 2, y = r.top + r.height / 2;
if (r.width === 0 || r.left < 0 || r.right > window.innerWidth || y < 0) return false;
const hit = document.elementFromPoint(x, y);
return hit === arguments[0] || arguments[0].contains(hit);
"""
