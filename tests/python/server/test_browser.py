"""Browsers: the built-in chat page at / in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium): the model picker fills from /v1/models, a message
streams a reply (several SSE events update the page before it ends; the reasoning sits in a
collapsed block), the stop button ends a long reply. And CORS as browsers use it: preflight
OPTIONS answered on every API route before authentication, the Allow-Origin header on
responses, a disallowed origin refused."""
import shutil
import time

import httpx
import pytest

from conftest import MODEL_NAME, Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model, "--max-model-len", "2048", "--api-key", "k3y", "--allowed-origins",
               "http://localhost:3000,https://ui.example")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert shutil.which(CHROMIUM) and shutil.which(DRIVER), \
        "chromium and chromium-driver are needed (Debian packages; `make test` installs them)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


def wait_for(fn, timeout=60, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_chat_page_streams_a_reply(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    browser.find_element(By.ID, "key").send_keys("k3y")
    browser.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#model option"), what="the model list")
    assert browser.find_element(By.ID, "model").get_attribute("value") == MODEL_NAME
    max_tokens = browser.find_element(By.ID, "max-tokens")
    max_tokens.clear()
    max_tokens.send_keys("40")
    browser.find_element(By.ID, "input").send_keys("Hello there")
    browser.find_element(By.ID, "send").click()
    box = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.assistant"), what="the reply box")[0]
    # Streaming: the page shows part of the reply while the rest is still coming.
    seen_partial = wait_for(lambda: browser.execute_script(
        "const b = document.querySelector('.msg.assistant');"
        "return !b.dataset.done && b.querySelector('.reasoning-text').textContent.length > 0"), what="a partial reply")
    assert seen_partial
    wait_for(lambda: box.get_attribute("data-done"), timeout=120, what="the end of the reply")
    assert box.get_attribute("data-done") == "length"
    assert browser.execute_script("return window.sparkserveEvents") > 10
    details = box.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.get_attribute("open") is None  # reasoning collapsed
    assert details.find_element(By.CSS_SELECTOR, ".reasoning-text").get_attribute("textContent")
    assert "40 tokens" in box.find_element(By.CSS_SELECTOR, ".meta").text

    # Stop: a long reply ends when the button is pressed.
    max_tokens.clear()
    max_tokens.send_keys("2000")
    browser.find_element(By.ID, "input").send_keys("Tell me more")
    browser.find_element(By.ID, "send").click()
    wait_for(lambda: browser.execute_script("return window.sparkserveEvents") > 60, what="the second reply")
    browser.find_element(By.ID, "stop").click()
    second = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1]
    wait_for(lambda: second.get_attribute("data-done"), timeout=30, what="the stop")
    assert second.get_attribute("data-done") == "stopped"
    assert browser.find_element(By.ID, "send").is_enabled()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                                  "/v1/models", "/tokenize"])
def test_cors_preflight_on_api_routes(server, path):
    r = httpx.options(server.url + path, headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 204, r.text  # before authentication: browsers send no key here
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization, content-type"


def test_cors_headers_and_refusals(server):
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "https://ui.example", "Authorization": "Bearer k3y"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ui.example"
    assert r.headers["vary"] == "Origin"
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "https://evil.example", "Authorization": "Bearer k3y"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.options(server.url + "/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 400
    # The chat page itself needs no key; the API does.
    assert httpx.get(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 401
