"""The shared, read-only WebShop world: products, goals, search index (built once per process).

Maps to docs/webshop.md §6.5 (one read-only catalogue and search index per process, so env
instances are cheap) and §6.1-6.3 (data sources). `load_world(cfg)` is cached by the config fields
that define the world, so the trainer's many env instances (threads included) share one object.

Data sources, by `cfg.data_dir`:
  ""                           generated catalogue (generator.generate_catalogue, seeded)
  folder with items_shuffle*   official products + items_ins_v2* attributes (+ human goals)
  folder with items_ins_v2* only   "hybrid": generated products for the real ASINs, keeping the
                               real attributes and synthetic instructions
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import catalogue, generator, goals as goal_builder
from .config import WebShopConfig
from .reward import get_noun_extractor, resolve_noun_extractor
from .search import BM25Index


@dataclass(frozen=True)
class World:
    products: list[dict]
    goals: list[dict]
    index: BM25Index
    source: str  # "generated" | "official" | "hybrid"
    nouns: Callable[[str], tuple[str, ...]]
    by_asin: dict[str, dict] = field(default_factory=dict)
    noun_extractor: str = "heuristic"  # the extractor actually used ("auto" resolved)


_CACHE: dict[tuple, World] = {}
_LOCK = threading.Lock()


def world_key(cfg: WebShopConfig) -> tuple:
    data_dir = str(Path(cfg.data_dir).expanduser().resolve()) if cfg.data_dir else ""
    return data_dir, cfg.catalogue_seed, cfg.num_products, cfg.goal_source, cfg.noun_extractor


def load_world(cfg: WebShopConfig) -> World:
    """The cached world for this config (built on first use; thread-safe)."""
    key = world_key(cfg)
    with _LOCK:
        world = _CACHE.get(key)
        if world is None:
            world = _CACHE[key] = build_world(cfg)
        return world


def _load_products(cfg: WebShopConfig) -> tuple[list[dict], dict, str]:
    if not cfg.data_dir:
        raw, attributes = generator.generate_catalogue(cfg.catalogue_seed, cfg.num_products or 1000)
        return catalogue.process_products(raw, attributes, cfg.catalogue_seed), attributes, "generated"
    data_dir = Path(cfg.data_dir).expanduser()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"env.webshop.data_dir={cfg.data_dir!r} is not a folder")
    attribute_file = catalogue.find_file(data_dir, catalogue.ATTRIBUTE_FILES)
    if attribute_file is None:
        raise FileNotFoundError(
            f"{data_dir}: no {' / '.join(catalogue.ATTRIBUTE_FILES)}; fetch the official files with "
            "`python -m envs.webshop.catalogue download --dest DIR` or leave data_dir empty"
        )
    attributes = catalogue.load_attributes(attribute_file)
    product_file = catalogue.find_file(data_dir, catalogue.PRODUCT_FILES)
    if product_file is not None:
        raw, source = catalogue.load_json(product_file), "official"
        if not isinstance(raw, list):
            raise ValueError(f"{product_file}: expected a JSON list of products")
    else:
        raw, source = generator.hybrid_catalogue(attributes, cfg.catalogue_seed, cfg.num_products), "hybrid"
    products = catalogue.process_products(raw, attributes, cfg.catalogue_seed, limit=cfg.num_products)
    return products, attributes, source


def build_world(cfg: WebShopConfig) -> World:
    cfg.validate()
    products, attributes, source = _load_products(cfg)
    human = None
    if cfg.goal_source == "human":
        path = Path(cfg.data_dir).expanduser() / catalogue.HUMAN_GOAL_FILE if cfg.data_dir else None
        if path is None or not path.is_file():
            raise FileNotFoundError(f"goal_source='human' needs {catalogue.HUMAN_GOAL_FILE} in env.webshop.data_dir")
        human = catalogue.load_human_instructions(path)
    return world_from_products(products, attributes, human, source=source, noun_extractor=cfg.noun_extractor)


def world_from_products(products: list[dict], attributes: dict, human: dict | None = None,
                        shuffle_seed: int = goal_builder.WEBSHOP_GOAL_SHUFFLE_SEED, source: str = "custom",
                        noun_extractor: str = "auto") -> World:
    """A world from processed products (catalogue.process_products); human goals if `human` is given."""
    if human is not None:
        goals = goal_builder.build_human_goals(products, human, shuffle_seed)
    else:
        goals = goal_builder.build_synthetic_goals(products, attributes, shuffle_seed)
    if not goals:
        raise ValueError(f"the {source} catalogue yields no {'human' if human is not None else 'synthetic'} goals")
    return World(
        products=products,
        goals=goals,
        index=BM25Index(products),
        source=source,
        nouns=get_noun_extractor(noun_extractor),
        by_asin={p["asin"]: p for p in products},
        noun_extractor=resolve_noun_extractor(noun_extractor),
    )
