"""The page at / (issue 62) in a real browser: Debian's headless Chromium driven by selenium's Python client, against
servers on 127.0.0.1 with the small index (the bundled sample's 60-passage cut). It asks a bundled question and
finds the hits and the drawn path to the second passage (the README's Hans J. Salter), every number as the explain
route gave it; the API's errors shown in the page with the typed question kept; the page of a store picks an index.

Skipped where selenium, chromium or chromedriver is missing (.ci/run installs them). Nothing is downloaded: the
driver is named by its path, so Selenium Manager never runs. The screenshot of docs/images/page.png is made here:
``LINEARRAG_SCREENSHOT_DIR=docs/images python -m pytest tests/serve/test_page.py -m slow`` (else a temporary
folder)."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from conftest import demo_questions  # noqa: E402
from test_serve import serving  # noqa: E402
from test_store import Served, make_root  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
THUNDER = demo_questions()[0]["question"]  # the README's question: its second hit is Hans J. Salter
WAIT = 60


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("no chromium / chromedriver (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="linearrag-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def until(driver, what, message: str):
    return WebDriverWait(driver, WAIT).until(lambda d: what(d), message)


def typed(driver, element_id: str, text: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.clear()
    if text:
        driver.execute_script("arguments[0].value = arguments[1];", box, text)  # (send_keys: a key at a time)
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'));", box)


def open_page(driver, url: str) -> None:
    driver.get(url + "/")
    until(driver, lambda d: d.find_element(By.ID, "limits").text or d.find_element(By.ID, "error").text,
          "the page did not read the server's limits")


def ask(driver, question: str):
    """Submit ``question``; the hit cards shown then (an error leaves the earlier ones)."""
    typed(driver, "questions", question)
    driver.execute_script("document.body.dataset.state = '';")
    driver.find_element(By.ID, "go").click()
    until(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("shown", "error"),
          "no answer shown")
    return driver.find_elements(By.CSS_SELECTOR, "li.hit")


def nodes(card) -> list:
    """(kind, label) of every node drawn in a hit's card."""
    return [(g.get_attribute("data-kind"), g.get_attribute("data-label"))
            for g in card.find_elements(By.CSS_SELECTOR, "svg g.node")]


def test_the_page_draws_the_hits_and_the_path_to_the_second_passage(browser, small_rag):
    shots = Path(os.environ.get("LINEARRAG_SCREENSHOT_DIR") or tempfile.mkdtemp())
    with serving(small_rag) as (url, _):
        open_page(browser, url)
        assert "At most 2000 characters a question" in browser.find_element(By.ID, "limits").text
        cards = ask(browser, THUNDER)
        want = httpx.post(url + "/v1/explain", json={"question": THUNDER, "include_text": True},
                          timeout=WAIT).json()["results"][0]
        # the hits as the API ranked them, each with its score and round as the API gave them
        titles = [c.find_element(By.CSS_SELECTOR, ".title").text for c in cards]
        assert titles == [h["title"] for h in want["hits"]]
        assert titles[:2] == ["Thunder on the Hill", "Hans J. Salter"]
        for card, h, found in zip(cards, want["hits"], want["found"]):
            head = card.find_element(By.CSS_SELECTOR, ".hit-head").text
            assert f"round {found['round']}" in head
            shown = float(card.find_element(By.CSS_SELECTOR, ".score").text.split()[1])
            assert shown == pytest.approx(h["score"], rel=1e-3)  # (4 digits shown)
        # the second passage's path: question -> the question's seed -> the film's sentence naming the composer
        # -> the composer's entity (a chain seed) -> the passage, each edge labelled with the engine's number
        salter = cards[1]
        drawn = nodes(salter)
        assert ("question", THUNDER) in drawn
        assert ("seed", "Thunder on the Hill") in drawn
        assert any(k == "sentence" and "Hans J. Salter" in t for k, t in drawn), drawn
        assert ("entity", "Hans J. Salter") in drawn
        assert ("passage", "Hans J. Salter") in drawn
        path = next(p for p in want["paths"][1] if p["nodes"][-1]["name"] == "Hans J. Salter")
        labels = {}
        for t in salter.find_elements(By.CSS_SELECTOR, "svg text.edge-label"):
            name, value = t.text.split()
            labels.setdefault(name, []).append(float(value))
        seed, sentence, entity = path["nodes"]
        for name, value in (("cos", seed["score"]), ("σ", sentence["sigma"]), ("w", entity["weight"])):
            assert any(x == pytest.approx(value, rel=1e-3) for x in labels[name]), (name, value, labels)
        assert len(salter.find_elements(By.CSS_SELECTOR, "svg path.edge")) >= 4
        # a click on the passage shows its text
        text = salter.find_element(By.CSS_SELECTOR, ".passage-text")
        assert not text.is_displayed()
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", salter)
        salter.find_element(By.CSS_SELECTOR, "g.node.passage").click()
        until(browser, lambda d: text.is_displayed(), "the passage's text was not shown")
        assert "Austrian-American film composer" in text.text
        browser.execute_script("window.scrollTo(0, 0);")
        shots.mkdir(parents=True, exist_ok=True)
        browser.set_window_size(1280, 1240)
        assert browser.save_screenshot(str(shots / "page.png"))


def test_the_apis_errors_are_shown_and_nothing_typed_is_lost(browser, small_rag):
    with serving(small_rag, api_key="sesame", max_question_chars=80) as (url, _):
        open_page(browser, url)  # without a key: the server's 401, shown
        assert "401" in browser.find_element(By.ID, "error").text
        typed(browser, "key", "sesame")
        until(browser, lambda d: "At most 80 characters" in d.find_element(By.ID, "limits").text, "no limits")
        assert len(ask(browser, THUNDER)) == 5
        typed(browser, "top_k", "3")

        def api(body, key="sesame"):
            r = httpx.post(url + "/v1/explain", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code in (401, 422), r.text
            d = r.json()["detail"]
            return d if isinstance(d, str) else d[0]["msg"]

        long = "Which country is the composer of the film Thunder On The Hill from, and who else?" * 2
        for question, key, msg in (("", "sesame", api({"question": ""})),
                                   (long, "sesame", api({"question": long})),
                                   (THUNDER, "wrong", api({"question": THUNDER}, key="wrong"))):
            typed(browser, "key", key)
            ask(browser, question)
            error = browser.find_element(By.ID, "error")
            assert error.is_displayed() and msg in error.text, (error.text, msg)
            assert ("422" if key == "sesame" else "401") in error.text
            # nothing thrown away: the question, the key, the settings and the last results stay
            assert browser.find_element(By.ID, "questions").get_attribute("value") == question
            assert browser.find_element(By.ID, "key").get_attribute("value") == key
            assert browser.find_element(By.ID, "top_k").get_attribute("value") == "3"
            assert len(browser.find_elements(By.CSS_SELECTOR, "li.hit")) == 5
        typed(browser, "key", "sesame")
        assert len(ask(browser, THUNDER)) == 3  # top_k from the form


def test_a_stores_page_picks_the_index(browser, small_rag, small_index_dir, tmp_path):
    make_root(small_rag, small_index_dir, tmp_path / "root")
    with Served([tmp_path / "root"]) as served:
        open_page(browser, served.url)
        options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#index option")]
        assert options == ["alpha", "beta"]
        browser.find_element(By.CSS_SELECTOR, "#index option[value='beta']").click()
        cards = ask(browser, THUNDER)
        want = httpx.post(served.url + "/v1/indexes/beta/explain", json={"question": THUNDER}).json()
        assert [c.find_element(By.CSS_SELECTOR, ".title").text for c in cards] == \
            [h["title"] for h in want["results"][0]["hits"]]
