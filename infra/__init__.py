"""Infrastructure under the algorithm: model loading (models.py), checkpoints and exact resume (checkpoint.py),
metrics and episode logs (metrics.py), and the distributed plumbing: launch checks, FSDP sharding, object exchange
between ranks, seeds (runtime.py)."""
