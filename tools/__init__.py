"""Tools around training, each run from the repository root as `python -m tools.<name>`: bench (speed),
smoke (GPU code-path checks on a random model), compare (multi-seed comparisons), warmup (format warm-up),
plots (learning and OOD curves), viewer (episodes and tip memory in a browser)."""
