"""WebShop site in a real headless Chromium: search, open the goal product, pick options, buy.

Needs the Debian packages `chromium` and `chromium-driver` and the `selenium` package; skips
cleanly when any is missing. The screenshot of the score page goes to pytest's tmp folder.
"""
import shutil
import threading

import pytest

from envs.webshop import WebShopConfig
from envs.webshop.app import create_app
from envs.webshop.world import load_world

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="chromium / chromedriver not installed"),
]


@pytest.fixture
def server():
    from werkzeug.serving import make_server

    world = load_world(WebShopConfig())
    httpd = make_server("127.0.0.1", 0, create_app(WebShopConfig(), world), threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", world
    httpd.shutdown()
    thread.join(timeout=10)


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1200,900", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def find(driver, by, value):
    return WebDriverWait(driver, 20).until(expected_conditions.presence_of_element_located((by, value)))


def submit(driver, element):
    """Click a form button and wait until the next page has fully replaced this one (every action reloads).

    A marker set on the old page's window disappears with the new document; polling it (ignoring the
    transient WebDriver errors of a page in the middle of navigating) avoids stale-element races.
    """
    driver.execute_script("window.__webshopOldPage = true;")
    element.click()

    def new_page_loaded(d):
        return d.execute_script("return !window.__webshopOldPage && document.readyState === 'complete';")

    WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(new_page_loaded)


def click_button(driver, text):
    submit(driver, find(driver, By.XPATH, f"//button[normalize-space(.)='{text}']"))


def test_purchase_in_headless_chromium(server, browser, tmp_path):
    base, world = server
    goal = world.goals[0]
    browser.get(f"{base}/?goal=0")
    assert find(browser, By.ID, "instruction").text == goal["instruction_text"]
    box = find(browser, By.ID, "search-input")
    box.send_keys(goal["instruction_text"])
    submit(browser, browser.find_element(By.ID, "search-button"))
    assert "Total results" in find(browser, By.ID, "keywords").find_element(By.XPATH, "..").text
    click_button(browser, goal["asin"])
    assert find(browser, By.ID, "product-title").text == world.by_asin[goal["asin"]]["Title"]
    for value in goal["goal_options"].values():
        click_button(browser, value)
    selected = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "button.option.selected")]
    assert sorted(selected) == sorted(goal["goal_options"].values())
    submit(browser, browser.find_element(By.ID, "buy-now"))
    assert find(browser, By.ID, "score").text == "1"
    assert "Thank you for shopping with us!" in browser.page_source
    shot = tmp_path / "webshop_purchase.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 1000
    # a hostile query in the real browser: rendered as text, never executed
    browser.get(f"{base}/?goal=1")
    find(browser, By.ID, "search-input").send_keys('<script>document.title="pwned"</script>')
    submit(browser, browser.find_element(By.ID, "search-button"))
    assert "<script>" in find(browser, By.ID, "keywords").text and browser.title != "pwned"
