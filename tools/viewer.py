"""A trajectory viewer: a small read-only web page over a run's output folder, to read episodes turn by turn.

    python -m tools.viewer runs/sanity_empo2 [--port 8000] [--host 127.0.0.1]     # then open http://127.0.0.1:8000/

RUN_DIR is a training run's output_dir or an eval.py output folder. Pages:
* `/`: the training iterations (mode and return from metrics.jsonl, a link to every rank's episode file), the
  validation, evaluation and OOD-adaptation episode files, the tip-memory snapshots, and eval.md.
* `/episodes/<file>`: the episodes of episodes/<file>.jsonl (written by infra.metrics.write_episodes; what train.py
  logs is set by train.log_episodes), or of episodes/<file>.jsonl.gz, the form results/ keeps them in.
* `/episodes/<file>/<index>`: one episode turn by turn: the observation, the tips that were in that step's prompt,
  the action and its reward; then the final observation and the tip the model wrote afterwards.
* `/memory/run` (RUN_DIR/memory.json, from eval.py --ood) and `/memory/iter_XXXXXX` (a checkpoint's memory.json):
  the stored tips per task key.

A file is read only when its page is asked for, so the viewer opens at once on a long run and a reload shows a
live run's new files. Only the file names above are served. Everything the model or the environment wrote is
HTML-escaped (model output is untrusted text). There is no authentication: keep the default host (this machine
only) and reach a remote run through a tunnel, e.g. `ssh -L 8000:localhost:8000 HOST`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from html import escape
from pathlib import Path

from flask import Flask, abort

from infra.metrics import jsonl_files, jsonl_text

# The episode files train.py and eval.py write; any other name is a 404, so no path ever leaves RUN_DIR.
TRAIN_FILE = re.compile(r"iter_(\d+)_rank(\d+)")  # one training iteration, one rank
VAL_FILE = re.compile(r"val_(\d+)")  # validation (no memory) at that iteration
EVAL_FILE = re.compile(r"evaluation|ood_step_\d+")  # eval.py, and eval.py --ood's adaptation steps
CHECKPOINT = re.compile(r"iter_\d+")
MAX_ENTRIES_SHOWN = 200  # per task key on a memory page (a slot holds up to memory.capacity = 1000)
TIP_PREVIEW = 80  # characters of the written tip in an episode list

STYLE = """body { font-family: sans-serif; max-width: 70em; margin: 1em auto; padding: 0 1em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: 4px; margin: 2px 0; }
.tips pre { background: #eef6ee; } .written pre { background: #fff4dd; } .missing { color: #999; }"""


def text(value) -> str:
    """A value as HTML-safe text. Model and environment output is untrusted: every piece of it goes through here."""
    return escape("" if value is None else str(value))


def number(value, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return text(value)
    return f"{value:.{digits}f}"


def as_list(value) -> list:
    """A list field of a record; [] when it is missing or not a list (an older or hand-edited file)."""
    return value if isinstance(value, list) else []


def pre(value) -> str:
    return f"<pre>{text(value)}</pre>"


def link(href: str, label) -> str:
    return f'<a href="{text(href)}">{text(label)}</a>'


def table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table; header and cells are HTML already (callers escape what they put in)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def bullets(items: list[str], when_empty: str) -> str:
    """A list of HTML items, or a note saying what is absent."""
    if not items:
        return f"<p class='missing'>{text(when_empty)}</p>"
    return "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{text(title)}</title><style>{STYLE}</style>"
            f"</head><body><p>{link('/', 'index')}</p><h1>{text(title)}</h1>{body}</body></html>")


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of x.jsonl (or of x.jsonl.gz where only that exists), one a line; a line that does not parse
    (torn by a crash mid-write) is skipped; [] where neither file exists."""
    records = []
    for line in (jsonl_text(path, errors="replace") or "").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def render_index(run_dir: Path) -> str:
    train_files: dict[int, dict[int, str]] = {}  # iteration -> rank -> file name
    val_files: dict[int, str] = {}
    eval_files: list[str] = []
    for name in jsonl_files(run_dir / "episodes"):
        if match := TRAIN_FILE.fullmatch(name):
            train_files.setdefault(int(match[1]), {})[int(match[2])] = name
        elif match := VAL_FILE.fullmatch(name):
            val_files[int(match[1])] = name
        elif EVAL_FILE.fullmatch(name):
            eval_files.append(name)
    metrics_path = run_dir / "metrics.jsonl"
    # A resumed run rewrites metrics.jsonl without the interrupted iteration's rows, so one row per iteration.
    metrics = {row["iteration"]: row for row in (read_jsonl(metrics_path) if metrics_path.is_file() else [])
               if isinstance(row.get("iteration"), int)}
    parts = ["<h2>Training</h2>"]
    if not (run_dir / "episodes").is_dir():
        parts.append("<p class='missing'>No episodes/ folder: nothing was logged turn by turn "
                     "(train.log_episodes = 0, or the run has not finished an iteration yet).</p>")
    iterations = sorted(set(train_files) | set(val_files) | set(metrics))
    if iterations:
        rows = []
        for iteration in iterations:
            row = metrics.get(iteration, {})
            ranks = " ".join(link(f"/episodes/{name}", f"rank {rank}")
                             for rank, name in sorted(train_files.get(iteration, {}).items()))
            rows.append([str(iteration), text(row.get("mode", "")), number(row.get("return_mean", "")),
                         number(row.get("success_rate", "")), number(row.get("val_return_mean", "")),
                         ranks or "<span class='missing'>not logged</span>",
                         link(f"/episodes/{val_files[iteration]}", "validation") if iteration in val_files else ""])
        parts.append(table(["iteration", "mode", "return (mean)", "success rate", "validation return",
                            "episodes", "validation episodes"], rows))
        if not metrics:
            parts.append("<p class='missing'>No metrics.jsonl: mode and returns unknown.</p>")
    else:
        parts.append("<p class='missing'>No training iterations (no metrics.jsonl, no episodes/iter_*.jsonl).</p>")
    parts.append("<h2>Evaluation</h2>")
    parts.append(bullets([link(f"/episodes/{name}", name) for name in eval_files],
                         "No evaluation episodes (episodes/evaluation.jsonl, episodes/ood_step_SS.jsonl)."))
    snapshots = [link("/memory/run", "memory.json (eval.py --ood)")] if (run_dir / "memory.json").is_file() else []
    snapshots += [link(f"/memory/{folder.name}", f"checkpoint {folder.name}")
                  for folder in sorted((run_dir / "checkpoints").glob("iter_*"))
                  if CHECKPOINT.fullmatch(folder.name) and (folder / "memory.json").is_file()]
    parts.append("<h2>Tip memory</h2>")
    parts.append(bullets(snapshots, "No memory snapshot (memory.json, checkpoints/iter_*/memory.json)."))
    if (run_dir / "eval.md").is_file():
        parts.append("<h2>eval.md</h2>" + pre((run_dir / "eval.md").read_text(errors="replace")))
    return page(f"Run {run_dir}", "".join(parts))


def render_episode_list(name: str, records: list[dict]) -> str:
    rows = []
    for index, record in enumerate(records):
        tip = str(record.get("tip") or "")
        task = f"{record.get('task', '')}" + (f" (repeat {record['repeat']})" if "repeat" in record else "")
        rows.append([link(f"/episodes/{name}/{index}", index), text(task), text(record.get("mode", "")),
                     number(record.get("return", "")), "yes" if record.get("success") else "no",
                     str(len(as_list(record.get("actions")))), text(record.get("truncated") or ""),
                     text(tip[:TIP_PREVIEW] + ("…" if len(tip) > TIP_PREVIEW else ""))])
    body = table(["#", "task", "mode", "return", "success", "actions", "truncated", "tip written"], rows) \
        if rows else "<p class='missing'>This file holds no episodes.</p>"
    return page(f"Episodes: {name}", body)


def render_episode(name: str, index: int, record: dict, count: int) -> str:
    observations, tips, actions, rewards, bonuses = (as_list(record.get(key)) for key in (
        "observations", "tips_shown", "actions", "rewards", "intrinsic"))
    nav = [link(f"/episodes/{name}", f"all episodes of {name}")]
    if index > 0:
        nav.insert(0, link(f"/episodes/{name}/{index - 1}", "previous"))
    if index + 1 < count:
        nav.append(link(f"/episodes/{name}/{index + 1}", "next"))
    facts = [[key, text(record[key])] for key in ("task", "mode", "group", "seed", "repeat", "truncated")
             if key in record]
    facts += [["return (what the advantage used)", number(record.get("return", ""))],
              ["return (environment)", number(record.get("extrinsic_return", ""))],
              ["success", "yes" if record.get("success") else "no"]]
    parts = ["<p>" + " | ".join(nav) + "</p>", table(["field", "value"], facts)]
    # Lists may differ in length (an episode cut by a crash or the context budget): show what each one has.
    for t in range(max(len(observations), len(actions))):
        parts.append(f"<h3>Step {t + 1}</h3><p>Observation</p>"
                     + (pre(observations[t]) if t < len(observations) else "<p class='missing'>(not recorded)</p>"))
        if t < len(tips) and str(tips[t]).strip():
            parts.append(f"<div class='tips'><p>Tips in the prompt</p>{pre(str(tips[t]).strip())}</div>")
        parts.append("<p>Action</p>"
                     + (pre(actions[t]) if t < len(actions) else "<p class='missing'>(no action recorded)</p>"))
        reward = f"reward {number(rewards[t])}" if t < len(rewards) else "reward not recorded"
        parts.append(f"<p>{reward}" + (f", novelty bonus {number(bonuses[t])}" if t < len(bonuses) else "") + "</p>")
    parts.append("<h3>Final observation</h3>" + pre(record.get("final_observation", "")))
    tip = str(record.get("tip") or "")
    parts.append("<div class='written'><h3>Tip written afterwards</h3>"
                 + (pre(tip) if tip else "<p class='missing'>(no tip was written for this episode)</p>") + "</div>")
    return page(f"{name} #{index}: {record.get('task', '')}", "".join(parts))


def render_memory(source: str, state: dict) -> str:
    entries = state.get("entries") if isinstance(state.get("entries"), dict) else {}
    visits = state.get("visits") if isinstance(state.get("visits"), dict) else {}
    total = sum(len(as_list(slot)) for slot in entries.values())
    parts = [f"<p>capacity {text(state.get('capacity', '?'))} per task, {len(entries)} task keys, {total} entries. "
             "Entries are listed highest return first, the order in which retrieval picks them.</p>"]
    for key in sorted(entries):
        slot = [e for e in as_list(entries[key]) if isinstance(e, dict)]
        # sorted() is stable: equal returns keep storage order, as memory.TipMemory.retrieve does.
        slot = sorted(slot, key=lambda e: -e["ret"] if isinstance(e.get("ret"), (int, float)) else 0.0)
        seen = visits.get(key)
        parts.append(f"<h2>{text(key)}</h2><p>{len(slot)} entries"
                     + (f", {len(seen)} distinct states visited" if isinstance(seen, dict) else "") + "</p>")
        rows = [[text(e.get("tip", "")), text(e.get("action", "")), number(e.get("ret", "")),
                 f"<details><summary>state</summary>{pre(e.get('state', ''))}</details>"]
                for e in slot[:MAX_ENTRIES_SHOWN]]
        parts.append(table(["tip", "action", "return", "observation"], rows))
        if len(slot) > MAX_ENTRIES_SHOWN:
            parts.append(f"<p class='missing'>{len(slot) - MAX_ENTRIES_SHOWN} more entries not shown.</p>")
    return page(f"Tip memory: {source}", "".join(parts))


def make_app(run_dir: Path) -> Flask:
    run_dir = Path(run_dir)
    app = Flask(__name__)

    def episode_records(name: str) -> list[dict]:
        """The records of episodes/<name>.jsonl or .jsonl.gz; 404 for an unknown name or a missing file."""
        name = name.removesuffix(".jsonl")
        # the name is checked before it reaches a glob: only the file names train.py and eval.py write
        if not any(p.fullmatch(name) for p in (TRAIN_FILE, VAL_FILE, EVAL_FILE)) or name not in jsonl_files(
                run_dir / "episodes", name):
            abort(404)
        return read_jsonl(run_dir / "episodes" / f"{name}.jsonl")

    @app.route("/")
    def index():
        return render_index(run_dir)

    @app.route("/episodes/<name>")
    def episode_list(name: str):
        return render_episode_list(name.removesuffix(".jsonl"), episode_records(name))

    @app.route("/episodes/<name>/<int:index>")
    def episode(name: str, index: int):
        records = episode_records(name)
        if index >= len(records):
            abort(404)
        return render_episode(name.removesuffix(".jsonl"), index, records[index], len(records))

    @app.route("/memory/<source>")
    def memory(source: str):
        if source == "run":
            path = run_dir / "memory.json"
        elif CHECKPOINT.fullmatch(source):
            path = run_dir / "checkpoints" / source / "memory.json"
        else:
            abort(404)
        if not path.is_file():
            abort(404)
        try:
            state = json.loads(path.read_text(errors="replace"))
        except ValueError:  # written atomically by TipMemory.save, so only a foreign or damaged file lands here
            return page(f"Tip memory: {source}", f"<p>{text(path)} is not valid JSON.</p>"), 500
        return render_memory(source, state if isinstance(state, dict) else {})

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Browse a run's episodes, tips and tip memory in a web browser.")
    parser.add_argument("run_dir", type=Path, help="a training run's output_dir or an eval.py output folder")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves every network (no authentication)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"tools.viewer: {args.run_dir} is not a directory", file=sys.stderr)
        sys.exit(2)
    print(f"serving {args.run_dir} on http://{args.host}:{args.port}/")
    make_app(args.run_dir).run(host=args.host, port=args.port)


if __name__ == "__main__":
    main()
