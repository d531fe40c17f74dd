"""Pointers that cannot go stale: every backticked project file (`rollout.py`, `engine/kvcache.py`) and every
backticked `module.name` of a project module (`samples.build_samples`, `memory.TipMemory.visit`) named in
README.md and docs/ exists, and so does every project name a results/ script imports or reads. Read with ast,
nothing imported, so it runs in about a second."""
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
        if token in modules:  # a module of a package (`tools.compare`)
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


# ---- error strings: every config key a user is told about exists ---------------------------------------------------

SECTION_KEY = re.compile(r"(?<![\w.])(" + "|".join(sorted(k for k in CONFIG_KEYS if "." not in k))
                         + r")\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?!\w|\()")


def stale_keys_in_errors(source: str, modules: dict[str, Path]) -> list[str]:
    """`section.key` tokens in the strings of raise statements and warnings.warn / sys.exit calls (what a user reads
    when something goes wrong) that are neither a config key (or the prefix of some, `memory.p_`), a removed key
    (config.REMOVED: its refusal names it), a data file (`model.safetensors`) nor a name of the project module of
    that name (`train.update`). A call (`env.step(...)`) is not a key."""
    from config import REMOVED

    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            said = [node.exc]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("warn",
                                                                                                           "exit"):
            said = node.args
        else:
            continue
        for part in (c for s in said for c in ast.walk(s) if isinstance(c, ast.Constant) and isinstance(c.value, str)):
            for match in SECTION_KEY.finditer(part.value):
                section, rest = match.groups()
                token = f"{section}.{rest}"
                if (token in CONFIG_KEYS or token in REMOVED or any(k.startswith(token) for k in CONFIG_KEYS)
                        or rest.split(".")[-1] in DATA_SUFFIXES
                        or (section in modules and rest.split(".")[0] in names_in(modules[section])[""])):
                    continue
                bad.append(token)
    return bad


def test_errors_name_config_keys_that_exist():
    modules = project_modules()
    files = [p for p in ROOT.rglob("*.py") if not {".venv", "results", "tests"} & set(p.relative_to(ROOT).parts)]
    assert len(files) > 40 and any(SECTION_KEY.search(p.read_text()) for p in files)  # the walk sees the project
    problems = {str(p.relative_to(ROOT)): stale_keys_in_errors(p.read_text(), modules) for p in files}
    assert not {path: bad for path, bad in problems.items() if bad}


def test_the_error_checker_sees_a_stale_key():
    modules = project_modules()
    fine = ('raise ValueError(f"set train.minibatch_steps or --loss.kl_coef={x}, see train.update; memory.p_*")\n'
            'warnings.warn("model.safetensors missing; env.step() failed; loss.advantage_eps (removed)")\n')
    assert stale_keys_in_errors(fine, modules) == []
    stale = ('raise LaunchError(f"use train.minibatches instead")\nsys.exit("set rollout.kv_cachee")\n'
             'print("train.nothing is only printed")\n')
    assert stale_keys_in_errors(stale, modules) == ["train.minibatches", "rollout.kv_cachee"]


# ---- results/ scripts: what they import from the project exists ----------------------------------------------------

def exported(path: Path) -> set[str]:
    """Names a module defines or imports at its top level (inside a top-level if/try too): what `from m import x`
    and `m.x` can reach."""
    found, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + [
                n for handler in getattr(node, "handlers", []) for n in handler.body]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return found


def stale_imports(source: str, modules: dict[str, Path]) -> list[str]:
    """Project names a script imports or reads (`from m import x`, `import m`, `m.x`) that the project lacks. A
    module outside the project's current set (an older checkout's top-level `models`, which a script that measures
    an old commit imports in its fallback branch) is not checked."""
    packages = {name.split(".")[0] for name in modules if "." in name}
    tree, bad, aliases = ast.parse(source), [], {}  # aliases: local name -> project module

    def has(module: str, name: str) -> bool:
        return f"{module}.{name}" in modules or name in exported(modules[module])

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module not in modules:
                if node.module.split(".")[0] in packages:
                    bad.append(node.module)
                continue
            for a in node.names:
                if not has(node.module, a.name):
                    bad.append(f"{node.module}.{a.name}")
                elif f"{node.module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                elif a.name.split(".")[0] in packages:
                    bad.append(a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module = aliases[node.value.id]
            if module in modules and not has(module, node.attr):
                bad.append(f"{module}.{node.attr}")
    return sorted(set(bad))


def test_results_scripts_import_what_the_project_has():
    modules = project_modules()
    scripts = sorted((ROOT / "results").rglob("*.py"))
    assert len(scripts) >= 20  # the walk sees them
    problems = {str(p.relative_to(ROOT)): stale_imports(p.read_text(), modules) for p in scripts}
    assert not {script: bad for script, bad in problems.items() if bad}


def test_results_scripts_find_the_project():
    """`python results/<folder>/<script>.py` puts the script's folder, not the repository, on sys.path: a script that
    imports the project inserts the root itself or documents `PYTHONPATH=.` in its usage line."""
    modules = project_modules()
    lost = []
    for path in sorted((ROOT / "results").rglob("*.py")):
        text = path.read_text()
        imports_project = any(
            isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
            and ((node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
            in {name.split(".")[0] for name in modules}
            for node in ast.walk(ast.parse(text)))
        if imports_project and "sys.path.insert" not in text and "PYTHONPATH=." not in text:
            lost.append(str(path.relative_to(ROOT)))
    assert not lost


def test_the_import_checker_sees_a_stale_import():
    modules = project_modules()
    fine = ("import rollout\nfrom engine import generation\nfrom infra.models import load_policy\n"
            "from rollout import generate\nrollout.run_episodes\ngeneration.generate\n"
            "try:\n    from models import load_policy\nexcept ImportError:\n    pass\n")
    assert stale_imports(fine, modules) == []
    stale = ("from advantages import intrinsic_return\nimport rollout as r\nr.nothing_here\n"
             "from engine.nowhere import x\nfrom engine import nowhere\n")
    assert stale_imports(stale, modules) == ["advantages.intrinsic_return", "engine.nowhere", "rollout.nothing_here"]
