"""WebShop Flask site: a purchase through the forms, and hostile / malformed input (never a 500)."""
import re

import pytest

from envs.webshop import WebShopConfig
from envs.webshop.app import MAX_SESSIONS, create_app
from envs.webshop.world import load_world


@pytest.fixture(scope="module")
def world():
    return load_world(WebShopConfig())


@pytest.fixture(scope="module")
def client(world):
    return create_app(WebShopConfig(), world).test_client()


def start(client, goal=0):
    response = client.get(f"/?goal={goal}")
    assert response.status_code == 303
    return response.headers["Location"]


def html(response):
    assert response.status_code != 500 and response.mimetype == "text/html"
    return response.get_data(as_text=True)


def test_purchase_through_the_site(client, world):
    sid = start(client, 0)
    goal = world.goals[0]
    page = html(client.get(sid))
    assert 'id="search-input"' in page and goal["instruction_text"] in page.replace("&#39;", "'")
    page = html(client.post(f"{sid}/search", data={"keywords": goal["instruction_text"]}, follow_redirects=True))
    assert "Total results: 50" in page and goal["asin"] in page
    page = html(client.post(f"{sid}/click", data={"target": goal["asin"].lower()}, follow_redirects=True))
    assert 'id="buy-now"' in page and 'id="product-title"' in page
    for value in goal["goal_options"].values():
        page = html(client.post(f"{sid}/click", data={"target": value}, follow_redirects=True))
    assert page.count('class="option selected"') == len(goal["goal_options"])
    page = html(client.post(f"{sid}/click", data={"target": "features"}, follow_redirects=True))
    assert "<li>" in page
    client.post(f"{sid}/click", data={"target": "< prev"})
    page = html(client.post(f"{sid}/click", data={"target": "buy now"}, follow_redirects=True))
    assert "Thank you for shopping with us!" in page and re.search(r'id="score">1<', page)
    page = html(client.post(f"{sid}/click", data={"target": "buy now"}, follow_redirects=True))
    assert "not available" in page  # the episode is over


def test_script_tags_are_escaped(client):
    sid = start(client)
    payload = '<script>alert("x")</script> hose'
    page = html(client.post(f"{sid}/search", data={"keywords": payload}, follow_redirects=True))
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    page = html(client.post(f"{sid}/click", data={"target": "<img src=x onerror=alert(1)>"}, follow_redirects=True))
    assert "<img src=x" not in page and "not available" in page


def test_hostile_and_malformed_requests(client):
    sid = start(client)
    cases = [
        (client.post(f"{sid}/search", data={"keywords": "a" * 100_000}, follow_redirects=True), 200),
        (client.post(f"{sid}/search", data={"keywords": "shoe " * 20_000}, follow_redirects=True), 200),
        (client.post(f"{sid}/search", data={}, follow_redirects=True), 200),
        (client.post(f"{sid}/search", data={"keywords": "\x00 ☃ \u202e"}, follow_redirects=True), 200),
        (client.post(f"{sid}/search", data=b"keywords=%ff%fe%00%ed%a0%80&&=", follow_redirects=True,
                     content_type="application/x-www-form-urlencoded"), 200),
        (client.post(f"{sid}/search", data=b"\xff\xfe garbage", content_type="multipart/form-data; boundary=x",
                     follow_redirects=True), 200),
        (client.post(f"{sid}/click", data={"target": "B0UNKNOWN1"}, follow_redirects=True), 200),
        (client.post(f"{sid}/click", data={"target": "b" * 5000}, follow_redirects=True), 200),
        (client.post(f"{sid}/click", data={}, follow_redirects=True), 200),
        (client.get("/s/not-a-session"), 404),
        (client.post("/s/deadbeef/click", data={"target": "buy now"}), 404),
        (client.post("/s/../../etc/passwd/search", data={"keywords": "x"}), 404),
        (client.get("/?goal=abc"), 400),
        (client.get("/?goal=-1"), 404),
        (client.get("/?goal=99999999999999999999"), 404),
        (client.get(f"{sid}/search"), 405),
        (client.get("/no/such/page"), 404),
        (client.post(f"{sid}/search", data={"keywords": "x" * (2 << 20)}), 413),
    ]
    for response, status in cases:
        assert response.status_code == status, response.request.path
        page = html(response)
        assert "<html" in page


def test_unknown_product_id_is_a_noop_page(client):
    sid = start(client)
    client.post(f"{sid}/search", data={"keywords": "hose"})
    page = html(client.post(f"{sid}/click", data={"target": "b0unknown1"}, follow_redirects=True))
    assert "not available" in page and "Total results" in page


def test_sessions_are_independent_and_bounded(world):
    app = create_app(WebShopConfig(), world)
    client = app.test_client()
    a, b = start(client, 1), start(client, 2)
    client.post(f"{a}/search", data={"keywords": "shirt"})
    assert 'id="search-input"' in html(client.get(b))  # b is untouched
    for _ in range(MAX_SESSIONS + 5):
        start(client)
    assert len(app.extensions["webshop_sessions"]) == MAX_SESSIONS
    assert client.get(a).status_code == 404  # the oldest sessions were evicted
