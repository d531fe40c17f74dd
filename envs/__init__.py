"""Environments behind one tiny interface (envs/base.py). `make_env` builds one from the `env` config section."""
from envs.base import Env, Task


def make_env(env_cfg) -> Env:
    """env_cfg: config.EnvConfig. Imports lazily so ScienceWorld/Java is only needed when used."""
    if env_cfg.name == "scienceworld":
        from envs.scienceworld import ScienceWorldEnv

        return ScienceWorldEnv(env_cfg.scienceworld)
    if env_cfg.name == "webshop":
        from envs.webshop import WebShopEnv

        return WebShopEnv(env_cfg.webshop)
    raise ValueError(f"unknown environment {env_cfg.name!r} (expected scienceworld or webshop)")


__all__ = ["Env", "Task", "make_env"]
