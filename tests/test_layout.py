"""The shape of the code base: no import circles between the project's modules (imports inside functions count
too), the entry points import on their own, core files stay small, and nothing points users at files that do not
ship with the repository."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ("train.py", "rollout.py", "samples.py", "losses.py", "advantages.py", "memory.py", "eval.py")


PACKAGES = ("engine", "infra", "tools", "envs")  # the generation engine, the infrastructure, the tools, environments


def project_modules() -> dict[str, Path]:
    """{dotted module name: file} for the top-level modules and everything under the packages."""
    modules = {path.stem: path for path in ROOT.glob("*.py")}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that `name` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule pkg.sub when there is one, else a name defined in pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles():
    modules = project_modules()
    graph = {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}
    assert graph["train"] >= {"rollout", "losses", "memory", "eval"}  # the walk sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_layering():
    """engine/ and infra/ sit below the algorithm: they import neither a top-level module (train, rollout, samples,
    losses, ..., config aside) nor tools/; nothing outside tools/ imports tools/ (tests and results/ scripts may)."""
    modules = project_modules()
    graph = {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}
    assert {"engine.generation", "engine.kvcache", "infra.models", "tools.bench"} <= set(graph)
    assert "engine.kvcache" in graph["engine.generation"] and "infra.models" in graph["train"]  # the walk sees them
    top_level = {name for name in modules if "." not in name and name not in PACKAGES and name != "config"}
    for name, imports in graph.items():
        if name.startswith(("engine", "infra")):
            below = {m for m in imports if m in top_level or m.partition(".")[0] == "tools"}
            assert not below, f"{name} (engine/infra) imports {sorted(below)}"
        if name.partition(".")[0] != "tools":
            tools = {m for m in imports if m.partition(".")[0] == "tools"}
            assert not tools, f"{name} imports the tools {sorted(tools)}"


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.slow
@pytest.mark.parametrize("module", ["train", "eval", "config"])
def test_entry_points_import_on_their_own(module):
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_importing_config_leaves_logging_alone():
    proc = subprocess.run([sys.executable, "-c", "import logging, sys, config; "
                           "assert not logging.getLogger().filters, logging.getLogger().filters; "
                           "assert 'py4j' not in sys.modules and 'torch' not in sys.modules"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def module_docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    return len(doc.splitlines()) if doc else 0


def test_core_files_and_docstrings_stay_small():
    for name in CORE:
        assert len((ROOT / name).read_text().splitlines()) <= 500, name  # the guide's ~300-500 lines per file
    for path in project_modules().values():
        assert module_docstring_lines(path) <= 40, path


def test_code_cites_only_files_that_ship():
    reference_docs = "/".join(("shared", "docs"))  # the project's private reference folder; users do not have it
    for path in list(project_modules().values()) + sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        assert reference_docs not in text, path
        for cited in set(word.strip("`'\"(),.;:") for word in text.split() if word.startswith(("docs/", "`docs/"))):
            if cited.endswith(".md"):
                assert (ROOT / cited).is_file(), f"{path.name} cites {cited}, which does not exist"
