"""The tree's import structure: every `specroll.*` module imports on its own and in a shuffled order (in a fresh
process), and the engine's imports run one way: config and core/stats ← sampling ← core ← models ← drafters
← gamma ← the engine's parts ← step ← engine (`specroll.rollout`'s docstring)."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ("specroll", "specroll.rollout", "specroll.online_drafter", "specroll.integrations", "specroll.demo",
            "specroll.benchmarks")
# specroll.rollout's layers, lowest first: a module imports only from its own layer or lower ones.
ROLLOUT_LAYERS = (("config", "core.stats"), ("sampling",), ("core",), ("models",), ("drafters",), ("gamma",),
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


def rollout_imports() -> dict[str, set[str]]:
    """Each `specroll.rollout` module → the `specroll.rollout` modules it imports (wherever in the file)."""
    files = module_files("specroll.rollout")
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
    graph, state, cycles = rollout_imports(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(" → ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles (type-only ones included):\n" + "\n".join(cycles)
