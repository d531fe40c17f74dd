"""Environments behind one tiny interface (envs/base.py). `make_env` builds one from the `env` config section;
`make_env_pool` builds the pool a rollout plays in (one environment per live episode)."""
from concurrent.futures import ThreadPoolExecutor

from envs.base import Env, Task


def make_env(env_cfg, jvm_host=None) -> Env:
    """env_cfg: config.EnvConfig. Imports lazily so ScienceWorld/Java is only needed when used. jvm_host: a shared
    ScienceWorld JVM (None: its own)."""
    if env_cfg.name == "scienceworld":
        from envs.scienceworld import ScienceWorldEnv

        return ScienceWorldEnv(env_cfg.scienceworld, jvm_host)
    if env_cfg.name == "webshop":
        from envs.webshop import WebShopEnv

        return WebShopEnv(env_cfg.webshop)
    if env_cfg.name == "sanity":
        from envs.sanity import SanityEnv

        return SanityEnv(env_cfg.sanity)
    raise ValueError(f"unknown environment {env_cfg.name!r} (expected scienceworld, webshop or sanity)")


def make_env_pool(env_cfg, size: int) -> list[Env]:
    """`size` environments, started in parallel threads (a ScienceWorld JVM takes seconds to start); ScienceWorld
    with `jvms: N` spreads them over N shared JVMs."""
    hosts = [None] * size
    if env_cfg.name == "scienceworld" and env_cfg.scienceworld.jvms > 0:
        from envs.scienceworld import shared_hosts

        hosts = shared_hosts(env_cfg.scienceworld, size)
    with ThreadPoolExecutor(max_workers=max(1, min(size, 8))) as pool:
        return list(pool.map(lambda host: make_env(env_cfg, host), hosts))


__all__ = ["Env", "Task", "make_env", "make_env_pool"]
