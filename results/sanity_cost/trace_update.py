r"""train.py with every update micro-batch printed: (tokens, steps, branch-packed?, action tokens) and its forward time.

    python results/sanity_cost/trace_update.py --config configs/sanity_empo2.yaml [overrides] | grep -a "START\|MICRO"

START lines carry a timestamp, so consecutive STARTs give forward + backward per micro-batch (update_profile.md).
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import train  # noqa: E402

original = train.samples_loss


def traced(model, micro, *args, **kwargs):
    start = time.perf_counter()
    print("START", round(start, 2), flush=True)
    out = original(model, micro, *args, **kwargs)
    print("MICRO", [(len(s.ids), s.steps, s.branches is not None, sum(s.mask)) for s in micro],
          f"fwd {time.perf_counter() - start:.2f}s", flush=True)
    return out


train.samples_loss = traced
train.main(sys.argv[1:])
