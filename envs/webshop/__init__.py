"""WebShop (docs/webshop.md): a faithful pure-Python re-implementation, in-process and as a Flask site.

    from envs.webshop import WebShopEnv, WebShopConfig
    env = WebShopEnv(WebShopConfig())            # offline generated catalogue by default
    first_prompt = env.reset(env.tasks("test")[0])

Modules: catalogue (official file formats, download helper), generator (offline catalogue),
goals, search (BM25), reward, engine (pages/observations/actions), world (shared cached data),
env (the Env interface + prompt), app (Flask site), agents (scripted/random agents, latency),
noun_agreement (the heuristic noun extractor measured against spaCy).
"""
from .config import WebShopConfig
from .env import WebShopEnv

__all__ = ["WebShopConfig", "WebShopEnv"]
