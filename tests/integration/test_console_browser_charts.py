"""The console's charts in a real headless Chromium against a real control service (issue
29): a day of history, usage and device-time written into the store as the control
service writes them; the Summary, a model's page and Usage draw exactly those numbers
(read back from the SVG in the browser's DOM), fit 1280 px and 390 px without scrolling
sideways, and are saved as screenshots in $LLMGW_TEST_ARTIFACTS for review."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.api.router import FIRST_BYTE_BUCKETS_S
from llmgw_runtime.control.history import model_point
from llmgw_runtime.store import Store
from llmgw_runtime.store.schema import device_time, history_classes, history_models, usage

from .conftest import Cluster, tiny_catalog
from .test_console_browser import artifacts, browser, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

H100 = "nvidia-h100-80gb"
KEYS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace")   # five drawn, two other
MINUTES = 24 * 60 - 10          # minute points up to 10 minutes ago (the recorder's are later)

# Each chart's series as the browser has them: name -> [data values, lines, drawn width].
SERIES = """
return Array.from(document.querySelectorAll(arguments[0] + ' g.series')).map(g =>
  [g.dataset.name, JSON.parse(g.dataset.values), g.querySelectorAll('polyline').length,
   g.getBBox().width]);
"""
BARS = """
return Array.from(document.querySelectorAll(arguments[0] + ' g.bar')).map(g =>
  [g.dataset.name, JSON.parse(g.dataset.value), g.querySelector('rect').getBBox().width]);
"""
SIDEWAYS = ("return [document.documentElement.scrollWidth, "
            "document.documentElement.clientWidth]")


def wave(i: int, top: int) -> int:
    return round(top * (1 + math.sin(i / 90)) / 2)


def seed(store_url: str, now: float) -> dict[str, Any]:
    """A day of minutes of class cpu and h100 and of model tiny, a week of hours of
    h100, usage of seven keys and device-time of two models per hour; what was written."""
    minute0 = math.floor(now / 60) * 60 - MINUTES * 60
    hour = math.floor(now / 3600) * 3600
    classes, models, used, held = [], [], [], []
    for i in range(MINUTES):
        t = minute0 + i * 60
        classes.append({"device_class": H100, "step": 60, "t": t, "devices": 8,
                        "used": wave(i, 8), "replicas": wave(i, 8) // 2})
        counts = [0] * (len(FIRST_BYTE_BUCKETS_S) + 1)
        counts[1 + wave(i, 3)] = 1 + i % 7
        models.append({"model": "tiny", "step": 60, "t": t, "ready": 1 + wave(i, 2),
                       "wanted": 1 + wave(i, 3), "waiting": wave(i, 5) if i % 40 < 10 else 0,
                       "busy": wave(i, 4), "slots": 4, "refused": 1 if i % 97 == 0 else 0,
                       "requests": sum(counts), "first_byte": json.dumps(counts)})
    hours = [{"device_class": H100, "step": 3600, "t": hour - h * 3600, "devices": 8,
              "used": h % 9, "replicas": h % 5} for h in range(26, 7 * 24)]
    for h in range(24):
        for n, key in enumerate(KEYS):
            used.append({"bucket": hour - h * 3600, "key": key, "model": "tiny",
                         "requests": 3, "prompt_tokens": (7 - n) * 1000 + h * 10,
                         "completion_tokens": 100 * n})
        held += [{"bucket": hour - h * 3600, "model": "tiny", "device_class": "cpu",
                  "seconds": 3600.0},
                 {"bucket": hour - h * 3600, "model": "big", "device_class": H100,
                  "seconds": 4 * 3600.0}]
    store = Store(store_url)
    try:
        with store.begin() as conn:
            conn.execute(history_classes.insert(), classes + hours)
            conn.execute(history_models.insert(), models)
            conn.execute(usage.insert(), used)
            conn.execute(device_time.insert(), held)
    finally:
        store.dispose()
    return {"classes": classes, "models": models, "usage": used, "hour": hour}


def log_in(driver: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By

    driver.get(cluster.control_url + "/console/")
    wait_for(driver, "the login page", lambda d: "/console/login" in d.current_url)
    driver.find_element(By.ID, "token").send_keys(cluster.admin_token)
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()
    wait_for(driver, "the summary", lambda d: d.title.startswith("Summary"))


def drawn(driver: Any, chart: str) -> dict[str, tuple[dict[float, Any], int, float]]:
    """A chart's series in the DOM: name -> ({t: value}, polylines, drawn width)."""
    return {name: ({t: v for t, v in values}, lines, width)
            for name, values, lines, width in driver.execute_script(SERIES, "#" + chart)}


def test_charts_draw_the_store_s_numbers_and_fit_a_laptop_and_a_phone(
        cluster_factory: Any, tmp_path: Path, browser: Any) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    cluster.start_control({"LLMGW_CONSOLE_REFRESH_S": "0",
                           "LLMGW_COST_PER_DEVICE_HOUR": f"{H100}=2.5"})
    cluster.apply(tiny_catalog(tmp_path / "tiny.gguf"))
    wrote = seed(cluster.store_url, time.time())
    shots = artifacts()
    log_in(browser, cluster)
    pages = {"summary": "/console/", "model": "/console/models/tiny",
             "usage": "/console/usage"}

    # The Summary: the h100 class's devices, used and ready replicas, minute by minute.
    browser.set_window_size(1280, 1000)
    browser.get(cluster.control_url + pages["summary"])
    h100 = drawn(browser, f"chart-class-{H100}")
    for row in wrote["classes"]:
        assert h100["used"][0][row["t"]] == row["used"], row
        assert h100["devices"][0][row["t"]] == 8
        assert h100["replicas ready"][0][row["t"]] == row["replicas"]
    assert all(lines >= 1 and width > 300 for _, lines, width in h100.values()), h100
    browser.find_element("link text", "7d").click()
    wait_for(browser, "the week", lambda d: "range=7d" in d.current_url)
    week = drawn(browser, f"chart-class-{H100}")
    for row in [r for r in wrote["classes"] if r["step"] == 3600]:
        assert week["used"][0][row["t"]] == row["used"], row

    # A model's page: requests per hour, first-byte p50/p90, waiting and refused.
    browser.get(cluster.control_url + pages["model"])
    tiny = {c: drawn(browser, c) for c in ("chart-requests", "chart-first-byte",
                                           "chart-waiting", "chart-tokens")}
    per_hour: dict[float, int] = {}
    for row in wrote["models"]:
        point = model_point({**row, "first_byte": json.loads(row["first_byte"])})
        assert tiny["chart-first-byte"]["p90"][0][row["t"]] == point.first_byte_p90_s
        assert tiny["chart-first-byte"]["p50"][0][row["t"]] == point.first_byte_p50_s
        assert tiny["chart-waiting"]["waiting (most)"][0][row["t"]] == row["waiting"]
        assert tiny["chart-waiting"]["refused per minute"][0][row["t"]] == row["refused"]
        hour = math.floor(row["t"] / 3600) * 3600
        per_hour[hour] = per_hour.get(hour, 0) + row["requests"]
    answered = tiny["chart-requests"]["answered"][0]
    for hour, n in per_hour.items():
        if hour < math.floor(time.time() / 3600) * 3600:     # the recorder adds to the last
            assert answered[hour] == n, (hour, answered.get(hour), n)
    prompt = tiny["chart-tokens"]["prompt"][0]
    assert prompt[wrote["hour"]] == sum(r["prompt_tokens"] for r in wrote["usage"]
                                        if r["bucket"] == wrote["hour"])

    # Usage: the five keys with the most tokens one by one, the other two summed.
    browser.get(cluster.control_url + pages["usage"])
    keys = drawn(browser, "chart-usage-keys")
    assert list(keys) == [*KEYS[:5], "other"]
    for row in wrote["usage"]:
        if row["key"] in KEYS[:5]:
            assert keys[row["key"]][0][row["bucket"]] == row["prompt_tokens"] + \
                row["completion_tokens"]
    assert keys["other"][0][wrote["hour"]] == sum(
        r["prompt_tokens"] + r["completion_tokens"] for r in wrote["usage"]
        if r["key"] in KEYS[5:] and r["bucket"] == wrote["hour"])
    bars = {name: (value, width) for name, value, width
            in browser.execute_script(BARS, "#chart-gpu-models")}
    assert bars[f"big ({H100})"][0] == pytest.approx(4 * 24) and \
        bars["tiny (cpu)"][0] == pytest.approx(24), bars
    assert bars[f"big ({H100})"][1] == pytest.approx(4 * bars["tiny (cpu)"][1], rel=0.01)
    assert "cost 240.00" in browser.execute_script(
        "return document.getElementById('chart-gpu-models').textContent")

    # A laptop and a phone: no page scrolls sideways, each chart fits; screenshots.
    for width, height in ((1280, 1800), (390, 2400)):
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        try:
            for name, path in pages.items():
                browser.get(cluster.control_url + path)
                wide, seen = browser.execute_script(SIDEWAYS)
                assert wide <= seen, f"{name} scrolls sideways at {width} px: {wide} > {seen}"
                for svg in browser.find_elements("css selector", "svg.chart"):
                    assert 0 < svg.rect["width"] <= seen and svg.rect["x"] >= 0, name
                png = shots / f"console-charts-{name}-{width}px.png"
                assert browser.save_screenshot(str(png)) and png.stat().st_size > 10_000
        finally:
            browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
