"""The WebShop engine served as a real web shop for people (Flask).

    python -m envs.webshop.app --port 3000 [--host 127.0.0.1] [--data-dir DIR] [--split test]

See docs/webshop.md §8; the counterpart of upstream WebShop's `app.py` (the human-facing site),
as a small Flask app. It renders the very same `WebShopEngine` state the
agents see, so a person can shop the same goals: search box, result pages, item page with option
groups, description/features/reviews, buy now, and a score page with the reward breakdown.

* `/` starts a session (one per visitor; `?goal=N` picks goal N, otherwise a random goal of the
  split) and redirects to `/s/<session id>`. Sessions live in memory (at most MAX_SESSIONS, least
  recently used evicted); an unknown or expired session id gets a 404 page.
* Every action is a POST form (`/s/<sid>/search` with `keywords`, `/s/<sid>/click` with
  `target`) followed by a redirect; an action that is illegal on the current page (an unknown
  product id, a stale button) is WebShop's no-op and the page says so.
* All user input is escaped (Jinja autoescaping); queries are cut to MAX_QUERY_CHARS characters;
  request bodies over 1 MB get a 413 page; every error is a proper HTML page.
"""
from __future__ import annotations

import argparse
import random
import secrets
import threading
from collections import OrderedDict

from flask import Flask, redirect, request
from jinja2 import DictLoader, Environment
from werkzeug.exceptions import HTTPException

from .config import WebShopConfig
from .engine import WebShopEngine
from .goals import split_indices
from .world import World, load_world

MAX_SESSIONS = 500
MAX_QUERY_CHARS = 2000

TEMPLATES = {
    "base.html": """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>WebShop{% if title %} - {{ title }}{% endif %}</title>
<style>
 body{font-family:sans-serif;max-width:900px;margin:1em auto;padding:0 1em;color:#222}
 .instruction{background:#fff8dc;border:1px solid #e0c060;padding:.6em;margin:.5em 0}
 form.inline{display:inline} button{margin:2px;cursor:pointer} .notice{color:#a00}
 .product{border-bottom:1px solid #ddd;padding:.4em 0} .price{color:#b12704}
 button.selected{background:#2a6;color:#fff} .options h4{margin:.4em 0 .1em}
</style></head><body>
<h1><a href="/">WebShop</a></h1>
{% block body %}{% endblock %}
</body></html>""",
    "macros.html": """{% macro click(sid, target, label, id='', cls='') -%}
<form class="inline" method="post" action="/s/{{ sid }}/click"><input type="hidden" name="target" value="{{ target }}">
<button type="submit"{% if id %} id="{{ id }}"{% endif %}
{%- if cls %} class="{{ cls }}"{% endif %}>{{ label }}</button></form>
{%- endmacro %}""",
    "shop.html": """{% extends "base.html" %}{% from "macros.html" import click %}
{% block body %}
<div class="instruction"><b>Instruction:</b> <span id="instruction">{{ e.instruction }}</span></div>
{% if notice %}<p class="notice" id="notice">{{ notice }}</p>{% endif %}
{% if e.page == "search" %}
<form method="post" action="/s/{{ sid }}/search">
<input id="search-input" name="keywords" size="60" maxlength="{{ max_query }}" placeholder="Search products" autofocus>
<button id="search-button" type="submit">Search</button></form>
{% elif e.page != "done" %}{{ click(sid, "back to search", "Back to Search", "back-to-search") }}{% endif %}
{% if e.page == "results" %}
 {% if e.page_num > 1 %}{{ click(sid, "< prev", "< Prev", "prev") }}{% endif %}
 {{ click(sid, "next >", "Next >", "next") }}
 <p>Search results for <b id="keywords">{{ e.keywords }}</b>:
 Page {{ e.page_num }} (Total results: {{ e.results|length }})</p>
 {% for p in e.page_results() %}<div class="product">{{ click(sid, p.asin|lower, p.asin, '', 'product-link') }}
 <span class="title">{{ p.Title }}</span> <span class="price">{{ p.price_text }}</span></div>{% endfor %}
{% elif e.page == "item" %}
 {{ click(sid, "< prev", "< Prev", "prev") }}
 <h2 id="product-title">{{ e.product.Title }}</h2>
 <div class="options">{% for name, values in e.product.options.items() %}<h4>{{ name }}</h4>
 {% for v in values %}{{ click(sid, v, v, '', 'option selected' if e.options.get(name) == v else 'option') }}
 {% endfor %}{% endfor %}</div>
 <p class="price">Price: {{ e.product.price_text }}</p><p>Rating: N.A.</p>
 {% for target in ("description", "features", "reviews") %}{{ click(sid, target, target|capitalize) }}{% endfor %}
 {{ click(sid, "buy now", "Buy Now", "buy-now") }}
{% elif e.page == "item_sub" %}
 {{ click(sid, "< prev", "< Prev", "prev") }}<h3>{{ e.sub_page|capitalize }}</h3>
 {% if e.sub_page == "description" %}<p>{{ e.product.Description }}</p>
 {% elif e.sub_page == "features" %}<ul>{% for b in e.product.BulletPoints %}<li>{{ b }}</li>{% endfor %}</ul>
 {% else %}<p>No reviews yet.</p>{% endif %}
{% elif e.page == "done" %}
 <h2>Thank you for shopping with us!</h2>
 <p>You bought <b>{{ e.product.Title }}</b> ({{ e.product.asin }}){% if e.options %} with
 {% for k, v in e.options.items() %}{{ k }}: {{ v }}{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}.</p>
 <p>Your score (min 0.0, max 1.0): <b id="score">{{ "%.4g"|format(e.reward) }}</b></p>
 <table border="1" cellpadding="4"><tr><th>part</th><th>value</th></tr>
 {% for k, v in e.reward_info.items() %}<tr><td>{{ k }}</td><td>{{ v }}</td></tr>{% endfor %}</table>
 <p>Goal product: {{ e.goal.asin }}. <a id="new-task" href="/">Start a new task</a></p>
{% endif %}
{% endblock %}""",
    "error.html": """{% extends "base.html" %}{% block body %}
<h2 id="error">{{ code }} - {{ title }}</h2><p>{{ message }}</p><p><a href="/">Start a new shopping task</a></p>
{% endblock %}""",
}
_JINJA = Environment(loader=DictLoader(TEMPLATES), autoescape=True)


class _Session:
    def __init__(self, engine: WebShopEngine):
        self.engine = engine
        self.notice = ""
        self.lock = threading.Lock()


def create_app(config: WebShopConfig | None = None, world: World | None = None, split: str = "test") -> Flask:
    config = config or WebShopConfig()
    world = world or load_world(config)
    goal_pool = list(split_indices(len(world.goals), split, config.test_goals)) or list(range(len(world.goals)))
    sessions: OrderedDict[str, _Session] = OrderedDict()
    store_lock = threading.Lock()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 1 << 20

    def page(template: str, status: int = 200, **context):
        return _JINJA.get_template(template).render(**context), status, {"Content-Type": "text/html; charset=utf-8"}

    def error_page(code: int, title: str, message: str):
        return page("error.html", code, code=code, title=title, message=message)

    def get_session(sid: str) -> _Session | None:
        with store_lock:
            session = sessions.get(sid)
            if session is not None:
                sessions.move_to_end(sid)
            return session

    def missing_session():
        return error_page(404, "Session not found", "This shopping session does not exist or has expired.")

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException):
        return error_page(err.code or 500, err.name, err.description or "")

    @app.errorhandler(Exception)
    def unexpected_error(err: Exception):  # pragma: no cover - a bug; still answer with a page
        app.logger.exception("unexpected error")
        return error_page(500, "Internal error", "Something went wrong; please start a new task.")

    @app.get("/")
    def start():
        raw = request.args.get("goal", "")
        if raw:
            try:
                goal = int(raw)
            except ValueError:
                return error_page(400, "Bad request", "The goal number must be an integer.")
            if not 0 <= goal < len(world.goals):
                return error_page(404, "No such goal", f"Goals are numbered 0 to {len(world.goals) - 1}.")
        else:
            goal = random.choice(goal_pool)
        engine = WebShopEngine(world)
        engine.reset(goal)
        sid = secrets.token_hex(16)
        with store_lock:
            sessions[sid] = _Session(engine)
            while len(sessions) > MAX_SESSIONS:
                sessions.popitem(last=False)
        return redirect(f"/s/{sid}", code=303)

    @app.get("/s/<sid>")
    def show(sid: str):
        session = get_session(sid)
        if session is None:
            return missing_session()
        with session.lock:
            notice, session.notice = session.notice, ""
            return page("shop.html", sid=sid, e=session.engine, notice=notice, max_query=MAX_QUERY_CHARS,
                        title=session.engine.page)

    @app.post("/s/<sid>/search")
    def search(sid: str):
        session = get_session(sid)
        if session is None:
            return missing_session()
        keywords = request.form.get("keywords", "")[:MAX_QUERY_CHARS]
        with session.lock:
            if not session.engine.search(keywords):
                session.notice = "Please type something to search for." if not keywords.strip() else \
                    "Search is not available on this page."
        return redirect(f"/s/{sid}", code=303)

    @app.post("/s/<sid>/click")
    def click(sid: str):
        session = get_session(sid)
        if session is None:
            return missing_session()
        target = request.form.get("target", "")[:MAX_QUERY_CHARS]
        with session.lock:
            if session.engine.done or not session.engine.click(target):
                session.notice = "That is not available on this page."
        return redirect(f"/s/{sid}", code=303)

    app.extensions["webshop_sessions"] = sessions
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="WebShop as a web site")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--catalogue-seed", type=int, default=0)
    parser.add_argument("--num-products", type=int, default=1000)
    parser.add_argument("--goal-source", default="synthetic")
    parser.add_argument("--split", default="test")
    args = parser.parse_args(argv)
    config = WebShopConfig(data_dir=args.data_dir, catalogue_seed=args.catalogue_seed,
                           num_products=args.num_products, goal_source=args.goal_source)
    app = create_app(config, split=args.split)
    print(f"WebShop on http://{args.host}:{args.port}/")
    app.run(host=args.host, port=args.port, threaded=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
