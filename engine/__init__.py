"""The generation engine that makes HF `generate` fast for multi-turn episodes: batched sampling with per-row
seeded streams and KV-cache reuse between turns (generation.py), the batch and per-episode KV caches (kvcache.py),
and branch-packed forwards that score a step's tip-free and tip contexts in one sequence (branches.py)."""
