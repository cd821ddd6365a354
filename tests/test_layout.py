"""The tree's import structure: every `specroll.*` module imports on its own and in a shuffled order (in a fresh
process), no installed module takes part in an import cycle (at module level or inside a function), the package
is what pyproject.toml installs and holds no one-off study, and the engine's imports run one way: config and
core/stats ← sampling ← core ← models ← drafters ← gamma ← the engine's parts ← step ← engine (`specroll.rollout`'s
docstring)."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specroll", "specroll.rollout", "specroll.online_drafter", "specroll.integrations", "specroll.demo")
# specroll.rollout's layers, lowest first: a module imports only from its own layer or lower ones.
ROLLOUT_LAYERS = (("require", "suffix_config", "config", "core.stats", "placement.device"), ("sampling",), ("core",),
                  ("models",), ("drafters",), ("gamma", "placement"),
                  ("engine_caches", "engine_speculation", "engine_weights"), ("step",), ("engine",), ("",))
# In one fresh process: imports every module named on the command line on its own (after dropping every specroll
# module already imported; third-party ones stay: they make a fresh import slow and cannot hide a cycle of ours),
# then all of them again, from none, in the order given. Sources are compiled once per process (this machine runs
# with PYTHONDONTWRITEBYTECODE: without the cache each re-import would compile them again). Prints the failures
# of each pass as JSON.
IMPORT_SCRIPT = """
import importlib, importlib.machinery, json, sys, traceback
compile_source, compiled = importlib.machinery.SourceFileLoader.get_code, {}
def get_code(loader, fullname):
    path = loader.get_filename(fullname)
    if path not in compiled:
        compiled[path] = compile_source(loader, fullname)
    return compiled[path]
importlib.machinery.SourceFileLoader.get_code = get_code
def drop_specroll():
    for loaded in [m for m in sys.modules if m == "specroll" or m.startswith("specroll.")]:
        del sys.modules[loaded]
def load(name, failed):
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(f"{name}:\\n{traceback.format_exc(limit=-3)}")
names, failed = json.loads(sys.argv[1]), {"alone": [], "in order": []}
for name in sorted(names):
    drop_specroll()
    load(name, failed["alone"])
drop_specroll()
for name in names:
    load(name, failed["in order"])
print(json.dumps(failed))
"""


def module_files(package: str) -> dict[str, Path]:
    """Every module in `package`'s folder and its subfolders, by dotted name."""
    root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
        out[name] = path
    return out


def all_modules() -> list[str]:
    return sorted({name for package in PACKAGES for name in module_files(package)})


@pytest.fixture(scope="module")
def import_failures(tmp_path_factory) -> dict[str, list[str]]:
    """The failures of importing every module alone, and all of them in a shuffled order (seed 34)."""
    names = all_modules()
    random.Random(34).shuffle(names)
    done = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT, json.dumps(names)], capture_output=True, text=True,
                          cwd=tmp_path_factory.mktemp("imports"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_module_imports_alone(import_failures):
    assert not import_failures["alone"], "\n".join(import_failures["alone"])


def test_every_module_imports_in_a_shuffled_order(import_failures):
    assert not import_failures["in order"], "\n".join(import_failures["in order"])


def installed_modules() -> dict[str, Path]:
    """Every module pyproject.toml installs (`packages`, each from its `package-dir` folder), by dotted name."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir, out = setuptools["package-dir"], {}
    for package in setuptools["packages"]:
        mapped = max((p for p in package_dir if package == p or package.startswith(f"{p}.")), key=len)
        folder = ROOT / package_dir[mapped] / Path(*package[len(mapped):].lstrip(".").split(".") if package != mapped
                                                  else ())
        for path in sorted(folder.glob("*.py")):
            out[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return out


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Each module of `files` → the modules of `files` it imports, wherever in the file (at the top, inside a
    function, under `TYPE_CHECKING`); `from package import name` counts as importing the submodule `name` if
    there is one, else the package."""
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                module = ".".join(part for part in (base, node.module) if part)
                targets.update(f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """One path per cycle a depth-first walk closes: "a → b → a"."""
    state, found = {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                found.append(" → ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def rollout_imports() -> dict[str, set[str]]:
    """Each `specroll.rollout` module → the `specroll.rollout` modules it imports (wherever in the file)."""
    return import_graph(module_files("specroll.rollout"))


def layer(module: str) -> int:
    relative = module.removeprefix("specroll.rollout").lstrip(".")
    matches = [(len(prefix), i) for i, prefixes in enumerate(ROLLOUT_LAYERS) for prefix in prefixes
               if relative == prefix or relative.startswith(f"{prefix}.") or not prefix]
    return max(matches)[1]  # the longest prefix that matches ("core.stats" over "core")


def test_rollout_imports_run_one_way():
    upward = [f"{source} → {target}" for source, targets in rollout_imports().items() for target in targets
              if layer(target) > layer(source)]
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))


def test_rollout_has_no_import_cycle():
    found = cycles(rollout_imports())
    assert not found, "import cycles (type-only ones included):\n" + "\n".join(found)


def test_installed_package_has_no_import_cycle():
    """Lazy imports included: a cycle hidden inside a function still ties two modules into one concept."""
    found = cycles(import_graph(installed_modules()))
    assert not found, "import cycles (lazy and type-only ones included):\n" + "\n".join(found)


def test_subpackages_import_one_way():
    """`specroll.X` folders, each taken as one node, form no loop: rollout ← online_drafter ← integrations ← jobs
    ← bench and tools: dependencies point one way, and the jobs never import a benchmark."""
    graph = import_graph(installed_modules())

    def folder(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folders: dict[str, set[str]] = {}
    for source, targets in graph.items():
        folders.setdefault(folder(source), set()).update(folder(t) for t in targets if folder(t) != folder(source))
    found = cycles(folders)
    assert not found, "subpackages importing each other:\n" + "\n".join(found)


def test_pyproject_installs_every_package_folder_and_no_study():
    """Every folder of a mapped package with an `__init__.py` is in `packages` (a wheel leaves nothing out), and
    neither benchmarks nor one-off studies are: `specroll bench` is `specroll.bench`, studies/ stays a checkout's."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            folders.add(".".join((package, *parts)))
    assert set(setuptools["packages"]) == folders
    assert not [p for p in setuptools["packages"] if "benchmarks" in p or "studies" in p]
    for name in ("specroll.benchmarks", "specroll.studies"):
        assert importlib.util.find_spec(name) is None, name
    assert not (ROOT / "studies" / "__init__.py").exists()
