"""Tokens of a tip block per `rollout.tip_format`, over the 300 tips SmolLM2 wrote in the tip-usefulness run
(results/comparison/tips/policy/memory.json), SmolLM2's tokenizer; blocks of 3 and 10 random tips (200 each).
That memory dump is out of the tree (issue 42); without a restored copy the script reads it from commit 14e19a7.

    python results/sanity_cost/tip_tokens.py
"""
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from memory import TipMemory, tip_block  # noqa: E402
from infra.models import load_tokenizer, resolve_model_path  # noqa: E402

tok = load_tokenizer(resolve_model_path("smollm2-135m-instruct"))
DUMP, COMMIT = "results/comparison/tips/policy/memory.json", "14e19a7"
memory = TipMemory()
if (ROOT / DUMP).exists():
    memory.load(str(ROOT / DUMP))
else:
    text = subprocess.run(["git", "show", f"{COMMIT}:{DUMP}"], cwd=ROOT, capture_output=True, text=True)
    if text.returncode != 0:
        sys.exit(f"{DUMP} is not here and git cannot read it from {COMMIT}: {text.stderr.strip()}\n"
                 f"(restore it: git checkout {COMMIT} -- {DUMP})")
    memory.load_state_dict(json.loads(text.stdout))
entries = [e for slot in memory.entries.values() for e in slot]


def n(text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


print(f"{len(entries)} tips")
print(f"per tip line: reference {statistics.mean(n(e.render()) for e in entries):.1f} tokens, "
      f"tip_only {statistics.mean(n(e.render('tip_only')) for e in entries):.1f}")
random.seed(0)
for k in (3, 10):
    blocks = [random.sample(entries, k) for _ in range(200)]
    ref = statistics.mean(n(tip_block(b)) for b in blocks)
    only = statistics.mean(n(tip_block(b, "tip_only")) for b in blocks)
    print(f"block of {k} tips: reference {ref:.0f} tokens, tip_only {only:.0f} ({only / ref:.2f}x)")
