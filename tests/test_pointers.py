"""Pointers that cannot go stale: every backticked project file (`rollout.py`, `engine/kvcache.py`) and every
backticked `module.name` of a project module (`samples.build_samples`, `memory.TipMemory.visit`) named in
README.md and docs/ exists. Read with ast, nothing imported, so it runs in well under a second."""
import ast
import re
from pathlib import Path

from config import Config, to_dict

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TICKED = re.compile(r"`([^`\s]+)`")
DATA_SUFFIXES = {"json", "jsonl", "md", "yaml", "png", "txt", "pt", "sh", "csv", "gz", "html", "safetensors"}
FILE_NAMES = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}


def config_keys(tree: dict | None = None, prefix: str = ""):
    """Every dotted config key (`loss.kl_coef`, `env.webshop.reward_mode`) and section (`env.webshop`)."""
    for key, value in (to_dict(Config()) if tree is None else tree).items():
        yield prefix + key
        if isinstance(value, dict):
            yield from config_keys(value, prefix + key + ".")


def project_modules() -> dict[str, Path]:
    """{dotted name: file} for the top-level modules and the packages' modules."""
    modules = {p.stem: p for p in ROOT.glob("*.py")}
    for package in ("engine", "infra", "tools", "envs"):
        for p in (ROOT / package).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return modules


def names_in(path: Path) -> dict[str, set[str]]:
    """{"": top-level names, class name: its attributes} defined in a module (functions, classes, assignments;
    an imported name does not count: a pointer names the module that defines it)."""
    tree = ast.parse(path.read_text())
    found: dict[str, set[str]] = {"": set()}

    def targets(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in tree.body:
        found[""].update(targets(node))
        if isinstance(node, ast.ClassDef):
            found[node.name] = {n for child in node.body for n in targets(child)}
    return found


def broken_pointers(text: str, modules: dict[str, Path]) -> list[str]:
    bad = []
    for token in TICKED.findall(text):
        token = token.rstrip(".,;:()")
        if token.endswith(".py") and "*" not in token and "<" not in token:
            # a path from the repo root (another repository's path starts elsewhere: `gigpo/core_gigpo.py`), or a
            # bare file name that some file of the repository has
            first = token.split("/")[0]
            ours = "/" not in token or (ROOT / first).exists()
            if ours and not ((ROOT / token).exists() or ("/" not in token and token in FILE_NAMES)):
                bad.append(token)
            continue
        parts = token.split(".")
        if (len(parts) < 2 or not all(p.isidentifier() for p in parts) or token.split("=")[0] in CONFIG_KEYS
                or parts[-1] in DATA_SUFFIXES):
            continue
        # the longest prefix that is a project module, then at most a class and its attribute
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if module in modules:
                rest = parts[cut:]
                names = names_in(modules[module])
                ok = rest[0] in names[""] and (len(rest) == 1 or (len(rest) == 2 and rest[1] in names.get(rest[0], ())))
                if not ok:
                    bad.append(token)
                break
    return bad


CONFIG_KEYS = set(config_keys())  # `train.minibatch_steps` is a config key, not a function of train.py


def test_every_named_file_and_function_exists():
    modules = project_modules()
    problems = {str(p.relative_to(ROOT)): broken_pointers(p.read_text(), modules) for p in PAGES}
    assert not {page: bad for page, bad in problems.items() if bad}


def test_the_checker_sees_a_stale_pointer():
    modules = project_modules()
    assert broken_pointers("`samples.build_samples` and `rollout.py`", modules) == []
    assert broken_pointers("`rollout.build_samples`, `memory.TipMemory.nothing`, `tools/nowhere.py`", modules) == [
        "rollout.build_samples", "memory.TipMemory.nothing", "tools/nowhere.py"]
