"""The gateway's page (serving/gateway/static) in a real headless Chromium against the real gateway and Triton:
the translation streams in piece by piece and ends equal to `POST /v1/translate`, sentiment and summary show
the API's answers, a clicked sentence draws its alignment heatmap, and bad input or a missing key shows an error
instead of breaking the page.

Needs Debian's `chromium` and `chromedriver` (`make test-tools` installs them). Selenium is given both paths, so
Selenium Manager never runs (it would try to download a browser). `ROPESERVE_SCREENSHOT=1` also writes
docs/images/gateway-page.png.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from serving.gateway.keys import hash_key
from serving.launcher.embedded import free_ports
from serving.launcher.gateway import Gateway, GatewayOptions

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "docs" / "images" / "gateway-page.png"
PARAGRAPH = "我爱你。今天天气很好。\n他是谁？"
WAIT_S = 60

# Records every change of #translation's text while the page works, to see the stream arrive in pieces.
RECORD_UPDATES = """
const target = document.getElementById("translation");
window.translationUpdates = [];
new MutationObserver(() => {
  window.translationUpdates.push({text: target.textContent, state: target.dataset.state});
}).observe(target, {childList: true, subtree: true, characterData: true, attributes: true,
                    attributeFilter: ["data-state"]});
"""


def post(url: str, body: dict, key: str | None = None) -> dict:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """Headless Debian Chromium at 1200x900, driven by Debian's chromedriver, browser console kept."""
    browser, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not browser or not driver_path:
        pytest.fail(
            "the page test needs Debian's chromium and chromedriver, missing here: run `make test-tools` "
            "(apt-get install chromium chromium-driver)"
        )
    options = Options()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(argument)
    options.add_argument("--lang=en-US")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.set_window_size(1200, 900)
        yield driver
    finally:
        driver.quit()


def wait(driver: webdriver.Chrome, condition, message: str):
    return WebDriverWait(driver, WAIT_S).until(lambda d: condition(d), message)


def state(driver: webdriver.Chrome) -> str:
    return driver.find_element(By.ID, "translation").get_attribute("data-state") or ""


def text_of(driver: webdriver.Chrome, element_id: str) -> str:
    """The element's text as the DOM holds it (Selenium's `.text` would fold the line breaks)."""
    return driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)


def uncaught_errors(driver: webdriver.Chrome) -> list[str]:
    """Severe console entries but the network's own "Failed to load resource" (an HTTP error answer)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
    ]


def options_of(driver: webdriver.Chrome, select_id: str) -> list[str]:
    return [o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, f"#{select_id} option")]


def enter_text(driver: webdriver.Chrome, text: str) -> None:
    source = driver.find_element(By.ID, "source")
    source.clear()
    if text:
        source.send_keys(text)
    assert source.get_attribute("value") == text


def test_page_streams_the_translation_and_shows_sentiment_summary_and_alignment(gateway):
    expected = post(f"{gateway.url}/v1/translate", {"texts": [PARAGRAPH], "num_beams": 1})["results"][0]
    verdict = post(f"{gateway.url}/v1/sentiment", {"texts": [PARAGRAPH]})["results"][0]
    summary = post(f"{gateway.url}/v1/summarize", {"texts": [PARAGRAPH]})["results"][0]

    with chromium() as driver:
        driver.get(gateway.url + "/")
        assert "ropeserve" in driver.title
        assert driver.find_element(By.ID, "beams").get_attribute("value") == "1"  # greedy streams fastest
        for picker, model in (("translator", "translate"), ("summarizer", "summarize")):  # the served ones, listed
            wait(driver, lambda d, p=picker: options_of(d, p), f"no model to pick in #{picker}")
            assert (
                options_of(driver, picker) == [model]
                and driver.find_element(By.ID, picker).get_attribute("value") == model
            )
        footer = driver.find_element(By.TAG_NAME, "footer").text
        assert "/openapi.json" in footer and "/v2/translate" in footer and "/translate" in footer

        enter_text(driver, PARAGRAPH)
        driver.execute_script(RECORD_UPDATES)
        driver.find_element(By.ID, "translate").click()
        wait(driver, lambda d: state(d) in ("done", "error"), "the translation stream never finished")
        assert state(driver) == "done", text_of(driver, "error")

        # The displayed translation is the API's, and it arrived in pieces before the stream was done.
        assert text_of(driver, "translation") == expected
        updates = driver.execute_script("return window.translationUpdates")
        texts = {u["text"] for u in updates if u["text"] and expected.startswith(u["text"])}
        partial = {u["text"] for u in updates if u["state"] == "streaming" and u["text"] in texts} - {expected}
        assert partial, f"no piece of the translation was shown before the stream ended: {updates}"
        assert len(texts) > 1, updates
        assert any(u["state"] == "streaming" for u in updates) and updates[-1]["state"] == "done"

        spans = driver.find_elements(By.CSS_SELECTOR, "#translation .sentence")
        assert [s.get_attribute("data-index") for s in spans] == ["0", "1", "2"]
        leftover = expected
        for piece in (s.get_attribute("textContent") for s in spans):
            assert piece and piece in leftover
            leftover = leftover.replace(piece, "", 1)
        assert leftover.strip() == ""  # what is not a sentence is a separator

        # Sentiment and summary: the API's answers, shown.
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#sentiment [data-label]"), "no sentiment shown")
        label = driver.find_element(By.CSS_SELECTOR, "#sentiment [data-label]").get_attribute("data-label")
        assert label in ("positive", "negative") and label == verdict["label"]
        score = driver.find_element(By.CSS_SELECTOR, "#sentiment .score").text
        assert re.fullmatch(r"\d{1,3}(\.\d)?%", score) and abs(float(score[:-1]) - verdict["score"] * 100) <= 0.051
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#summary .summary-text"), "no summary shown")
        shown = driver.find_element(By.CSS_SELECTOR, "#summary .summary-text").text
        assert shown.strip() and shown == summary

        # The second sentence's alignment: one heatmap row per target token, one column per source token.
        second = spans[1]
        sentence = second.get_attribute("title")
        assert sentence == "今天天气很好。"
        explained = post(f"{gateway.url}/v1/explain/translate", {"text": sentence})
        second.click()
        rows = "#alignment table.heatmap tbody tr"
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, rows), "no alignment heatmap shown")
        assert driver.find_element(By.ID, "alignment").is_displayed()
        assert len(driver.find_elements(By.CSS_SELECTOR, rows)) == len(explained["target_tokens"])
        first_row = driver.find_elements(By.CSS_SELECTOR, f"{rows}:first-child td")
        assert len(first_row) == len(explained["source_tokens"])
        assert first_row[0].get_attribute("title")  # a tooltip with the weight
        assert sentence in driver.find_element(By.CSS_SELECTOR, "#alignment h3").text
        assert len(driver.find_elements(By.CSS_SELECTOR, "#alignment .pairs li")) == len(explained["target_tokens"])
        assert "selected" in second.get_attribute("class")
        assert not driver.find_element(By.ID, "error").is_displayed()
        assert uncaught_errors(driver) == []

        if os.environ.get("ROPESERVE_SCREENSHOT") == "1":
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            chrome = driver.execute_script("return window.outerHeight - window.innerHeight")
            driver.set_window_size(1200, 900 + chrome)  # the page itself at 1200x900
            driver.execute_script("window.scrollTo(0, 0)")
            assert driver.save_screenshot(str(SCREENSHOT))

        # An empty text: a message in #error, and the page still works.
        enter_text(driver, "")
        driver.find_element(By.ID, "translate").click()
        error = driver.find_element(By.ID, "error")
        wait(driver, lambda d: error.is_displayed() and error.text.strip(), "no error shown for an empty text")
        assert error.get_attribute("role") == "alert"
        assert uncaught_errors(driver) == []


@pytest.fixture(scope="module")
def keyed_gateway(triton, tmp_path_factory):
    keys = tmp_path_factory.mktemp("page-keys") / "keys.toml"
    keys.write_text(f'[keys.page]\nsha256 = "{hash_key("k-page-3e1d")}"\n', encoding="utf-8")
    [port] = free_ports(1)
    with Gateway(GatewayOptions(triton_grpc=triton.grpc_url, port=port, keys_file=keys)) as running:
        yield running


def test_page_shows_the_gateways_refusal_and_sends_the_stored_key(keyed_gateway):
    with chromium() as driver:
        driver.get(keyed_gateway.url + "/")
        enter_text(driver, "我爱你。")
        driver.find_element(By.ID, "source").send_keys(Keys.CONTROL, Keys.ENTER)  # the keyboard shortcut
        wait(driver, lambda d: state(d) == "error", "a request without a key did not end in an error")
        error = driver.find_element(By.ID, "error")
        assert error.is_displayed() and "API key is required" in error.text and "403" in error.text
        assert uncaught_errors(driver) == []

        driver.find_element(By.ID, "api-key").send_keys("k-page-3e1d")
        driver.refresh()  # the key is kept in localStorage
        assert driver.find_element(By.ID, "api-key").get_attribute("value") == "k-page-3e1d"
        enter_text(driver, "我爱你。")
        driver.find_element(By.ID, "translate").click()
        wait(driver, lambda d: state(d) in ("done", "error"), "the keyed translation never finished")
        assert state(driver) == "done", text_of(driver, "error")
        expected = post(f"{keyed_gateway.url}/v1/translate", {"texts": ["我爱你。"], "num_beams": 1}, "k-page-3e1d")
        assert text_of(driver, "translation") == expected["results"][0]
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#summary .summary-text"), "no summary shown")
        assert not driver.find_element(By.ID, "error").is_displayed()
