"""Few-shot demos: ScienceWorld's own gold path, replayed, and cached in the process and on disk.

Deviation: the reference ships two fixed, hand-picked gold transcripts per task. We build ours from ScienceWorld's
gold action sequence (``load(..., generateGoldPath=True)``, ``getGoldActionSequence()``), replayed to record the
observations, on training-split variations that are *not* among the first ``train_variations`` used for training,
then on the dev split when the training split is too small (identify-life-stages-2). A replay that does not reach
score 100 (gold generation is not fully deterministic in the temperature tasks) is skipped and the next candidate is
tried (at most ``num_demos + 4`` candidates). Layout: `prompts.format_demo`.

Cache: in-process (one dict for all envs of the process, lock-protected, one generator per key at a time while the
others wait for its result) and on disk as JSON under ``$EMPO2_CACHE/scienceworld_demos/`` (default
``~/.cache/empo2/scienceworld_demos/``; ``demo_cache_dir`` overrides), written atomically (temp file +
``os.replace``). The key is (task, simplification, num_demos, demo_max_steps, train_variations, scienceworld
version): ``train_variations`` decides which variations are held out for demos. Only a complete set is written to
disk, so an incomplete one is retried by the next process. An unwritable cache directory is logged, not fatal.
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from .config import ScienceWorldConfig
from .prompts import format_demo, task_description

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_memory: dict[str, list[str]] = {}  # demo key -> demos, shared by every env of the process
_key_locks: dict[str, threading.Lock] = {}


def _scienceworld_version() -> str:
    try:
        from scienceworld.version import __version__

        return str(__version__)
    except Exception:  # pragma: no cover - version module layout changed
        return "unknown"


def demo_key(cfg: ScienceWorldConfig, name: str) -> str:
    return (
        f"{name}|{cfg.simplification or 'none'}|demos={cfg.num_demos}|max_steps={cfg.demo_max_steps}"
        f"|train_variations={cfg.train_variations}|scienceworld={_scienceworld_version()}"
    )


def demo_path(cfg: ScienceWorldConfig, key: str) -> Path:
    if cfg.demo_cache_dir:
        root = Path(cfg.demo_cache_dir).expanduser()
    elif os.environ.get("EMPO2_CACHE"):
        root = Path(os.environ["EMPO2_CACHE"]).expanduser() / "scienceworld_demos"
    else:
        root = Path.home() / ".cache" / "empo2" / "scienceworld_demos"
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key.replace("|", "__"))
    return root / f"{safe}.json"


def cached_demos(cfg: ScienceWorldConfig, name: str,
                 generate: Callable[[], tuple[list[str], list[int]]]) -> list[str]:
    """The demos of task `name`: from memory, else from disk, else `generate()` -> (demos, variations used)."""
    key = demo_key(cfg, name)
    with _lock:
        if key in _memory:
            return list(_memory[key])
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:  # one generator per key; other instances wait for its result
        with _lock:
            if key in _memory:
                return list(_memory[key])
        path = demo_path(cfg, key)
        demos = _read_demo_file(path, key)
        if demos is None:
            started = time.perf_counter()
            demos, variations = generate()
            logger.info("generated %d ScienceWorld demos for %s (variations %s) in %.1f s",
                        len(demos), name, variations, time.perf_counter() - started)
            if len(demos) == cfg.num_demos:  # an incomplete set is retried by the next process
                _write_demo_file(path, {"key": key, "task": name, "variations": variations, "demos": demos})
        with _lock:
            _memory[key] = list(demos)
        return list(demos)


def forget_demos(name: str | None = None) -> None:
    """Empty the in-process cache (of task `name` only, if given); the disk cache stays."""
    with _lock:
        for key in [k for k in _memory if name is None or k.startswith(f"{name}|")]:
            del _memory[key]


def generate_demos(server, load: Callable[[int], None], name: str, candidates: list[int], num_demos: int,
                   max_steps: int = 0) -> tuple[list[str], list[int]]:
    """Replay the gold path of the candidate variations until `num_demos` reach score 100.

    server: the JVM's PythonInterface; load(variation) loads `name` with gold-path generation.
    Returns (demos, variations used)."""
    demos: list[str] = []
    used: list[int] = []
    for variation in candidates[: num_demos + 4]:
        load(variation)
        gold = [str(a) for a in server.getGoldActionSequence()]
        server.reset()
        observations = [str(server.step("look around"))]
        for action in gold:
            observations.append(str(server.step(action)))
        score = int(round(100 * server.getScore()))
        if score < 100:
            logger.warning("gold path of %s variation %d reached only %d; skipping it", name, variation, score)
            continue
        desc = task_description(str(server.freeActionTaskDesc()))
        demos.append(format_demo(desc, observations, gold, max_steps))
        used.append(variation)
        if len(demos) >= num_demos:
            break
    if len(demos) < num_demos:
        logger.warning("only %d of %d demos for %s", len(demos), num_demos, name)
    return demos, used


def _read_demo_file(path: Path, key: str) -> list[str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("demos"), list):
        return None
    return [str(d) for d in data["demos"]]


def _write_demo_file(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as err:  # a read-only cache is not fatal
        logger.warning("could not write the demo cache %s: %s", path, err)
