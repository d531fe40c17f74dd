"""WebShop options (the `env.webshop` config section)."""
from dataclasses import dataclass


@dataclass
class WebShopConfig:
    max_steps: int = 15
