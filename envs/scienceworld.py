"""ScienceWorld environment (placeholder; being written)."""
from dataclasses import dataclass, field


@dataclass
class ScienceWorldConfig:
    tasks: list[str] = field(default_factory=lambda: ["power-component"])
    simplification: str = "easy"
    max_steps: int = 30
    train_variations: int = 5
    test_variations: int = 20
    num_demos: int = 2
    demo_max_steps: int = 0
    action_correction: bool = True
