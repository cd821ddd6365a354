#!/usr/bin/env bash
# Make `python -m specroll.bench.gpu_check` importable on a machine without network, with the torch and
# transformers it has (the lent GPU machine: Python 3.12, torch 2.11, transformers 5.17). From the repository root:
#
#   eval "$(bash specroll/bench/gpu_check_install.sh)" && python -m specroll.bench.gpu_check
#
# Nothing is downloaded, and nothing is installed unless you ask: gpu_check's import path needs only torch,
# transformers and the standard library (tests/test_gpu_check.py checks that), and it runs on torch >= 2.11
# and transformers >= 5.17 as well as on the project's pins. `pip install .` would instead try to fetch
# torch==2.13.0 and transformers>=5.20. So the script lays the source tree out as the `specroll` package
# (pyproject's package-dir: `rollout/` is `specroll.rollout`, ...) with symbolic links in a folder of its own
# ($SPECROLL_VIEW, default a fresh temporary folder), checks the versions it finds, imports gpu_check once,
# and prints the `export PYTHONPATH=... PYTHONSAFEPATH=1` that makes it importable (everything else goes to
# stderr). PYTHONSAFEPATH (Python >= 3.11) keeps the current folder off sys.path: run from the repository root,
# `python -m` would otherwise find the source tree's own `specroll/` folder first, which lacks the subpackages.
#
# Wheels for anything the machine lacks: download them here into a git-ignored folder, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .gpu_check_wheels <package>==<version>
# carry it with the device run (`run(..., carry=[".gpu_check_wheels"])`), and pass WHEELS=.gpu_check_wheels:
# they are installed first with `pip install --no-index --no-deps`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
view="${SPECROLL_VIEW:-$(mktemp -d)}"
python="${PYTHON:-python}"

if [[ -n "${WHEELS:-}" ]]; then
    "$python" -m pip install --no-index --no-deps "$WHEELS"/*.whl >&2
fi

"$python" - "$root" "$view" >&2 <<'PY'
import pathlib
import sys
import tomllib

root, view = (pathlib.Path(arg) for arg in sys.argv[1:])
package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
top = view / "specroll"
top.mkdir(parents=True, exist_ok=True)
for entry in (root / package_dir["specroll"]).iterdir():  # the top package's own modules and subpackages
    link = top / entry.name
    if not link.exists():
        link.symlink_to(entry)
for package, folder in package_dir.items():  # the subpackages kept in folders of their own
    if package != "specroll":
        link = view.joinpath(*package.split("."))
        if not link.exists():
            link.symlink_to(root / folder)
print(f"specroll laid out under {view} from {root}")
PY

PYTHONSAFEPATH=1 PYTHONPATH="$view${PYTHONPATH:+:$PYTHONPATH}" "$python" - >&2 <<'PY'
import re

import torch
import transformers


def release(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


for name, module, floor in (("torch", torch, (2, 11)), ("transformers", transformers, (5, 17))):
    if release(module.__version__) < floor:
        raise SystemExit(f"{name} {module.__version__} is older than gpu_check needs ({floor[0]}.{floor[1]})")
import specroll.bench.gpu_check  # noqa: E402,F401  (fails here, not in the run, if anything is missing)

print(f"gpu_check imports: torch {torch.__version__} (CUDA {torch.cuda.is_available()}), "
      f"transformers {transformers.__version__}")
PY

echo "export PYTHONSAFEPATH=1 PYTHONPATH=$view\${PYTHONPATH:+:\$PYTHONPATH}"
