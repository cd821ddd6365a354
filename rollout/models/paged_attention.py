"""Paged attention on a CPU: attention that reads K/V where the paged cache keeps them, through the block table.

Without a kernel the paged cache copies each forward's blocks into a dense workspace before SDPA
(`paged.GatherSpace`): a memory-bound copy of everything attention then reads again, 5 % of a plain demo step on
this project's 2-core CPU. This kernel (C++, `paged_attention.cpp` beside this file, built with
`torch.utils.cpp_extension` on first use, as vLLM's CPU backend builds its paged attention) reads each slot
`table[b, t // block_size] · block_size + t % block_size` of the pools in place: per (row, K/V head), one pass
over the keys scores every query of the heads that share it (GQA folded: K is read once), a softmax per query in
fp32, one pass over the values. It takes what the lean forward passes SDPA — q [n, Hq, Q, D], a boolean mask
[n or 1, 1, Q, K] — in fp32, bf16 or fp16 (fp32 accumulation), and returns SDPA's [n, Hq, Q, Dv]. Its sums run in
another order than SDPA's: outputs agree to fp32 rounding, not bit for bit.

`kernel()` builds it once per process (torch's build lock serialises concurrent builds; the build is cached under
`SPECROLL_KERNEL_DIR`, default `~/.cache/specroll/kernels`, per source and CPU, since it is compiled for the machine
it runs on; a build no process has loaded for `STALE_DAYS` is removed when another is loaded) and returns None,
warning once, where it cannot be built (no compiler): the copy path then serves.
`SPECROLL_PAGED_KERNEL=0` turns it off. GPUs keep the copy path (a block-table kernel there is FlashInfer's or
flash-attn's job).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import time
import warnings
from pathlib import Path

import torch

SOURCE_PATH = Path(__file__).with_name("paged_attention.cpp")  # the kernel's C++ (package data)

DECLARATION = ("at::Tensor paged_attention(at::Tensor q, at::Tensor keys, at::Tensor values, at::Tensor table, "
               "at::Tensor mask, int64_t block_size, int64_t kv_len, double scale);")
FLAGS = ["-O3", "-march=native", "-fopenmp"]
LDFLAGS = ["-fopenmp", "-lmvec"]
STALE_DAYS = 30  # a build directory not loaded for this long is pruned (another source, torch or CPU built it)


def enabled() -> bool:
    """False where `SPECROLL_PAGED_KERNEL=0` turns the kernel off."""
    return os.environ.get("SPECROLL_PAGED_KERNEL", "1") != "0"


@functools.cache
def kernel():
    """The built extension (`paged_attention(q, keys, values, table, mask, block_size, kv_len, scale)`), or None
    where it cannot be built (a warning says why, once)."""
    from torch.utils import cpp_extension

    from specroll.extras import hint

    lacking = hint({"kernel": ("ninja", "setuptools")}, "the CPU paged-attention kernel's build")
    if lacking is not None:
        warnings.warn(f"{lacking}; the paged cache copies its blocks into a workspace instead (slower; "
                      "SPECROLL_PAGED_KERNEL=0 silences this)", stacklevel=2)
        return None
    source = SOURCE_PATH.read_text()
    parts = [source, *FLAGS, *LDFLAGS, torch.__version__, _cpu_model()]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    root = Path(os.environ.get("SPECROLL_KERNEL_DIR", Path.home() / ".cache" / "specroll" / "kernels"))
    build = root / f"paged_attention_{key}"
    build.mkdir(parents=True, exist_ok=True)
    try:
        module = cpp_extension.load_inline(f"specroll_paged_attention_{key}",
                                           cpp_sources=[f"{DECLARATION}\n{source}"], functions=["paged_attention"],
                                           extra_cflags=FLAGS, extra_ldflags=LDFLAGS, build_directory=str(build),
                                           verbose=False)
    except (RuntimeError, OSError, ImportError) as err:  # no compiler or ninja: the copy path serves
        warnings.warn(f"the CPU paged-attention kernel could not be built ({err}); the paged cache copies its "
                      "blocks into a workspace instead (slower; SPECROLL_PAGED_KERNEL=0 silences this)", stacklevel=2)
        return None
    prune_stale(root, build)
    return module


def prune_stale(root: Path, loaded: Path, max_age_s: float = STALE_DAYS * 86400.0) -> list[Path]:
    """Mark `loaded` used now and remove the other kernel builds under `root` unused for `max_age_s` (their
    directory's modification time: each load touches its own). A process that loaded one already keeps it mapped;
    one that would load it rebuilds. Returns what was removed."""
    now = time.time()
    try:
        os.utime(loaded, (now, now))
    except OSError:  # a read-only cache (shared, prebuilt): nothing to mark, and nothing of ours to prune
        return []
    removed = []
    for old in root.glob("paged_attention_*"):
        try:
            if old != loaded and old.is_dir() and now - old.stat().st_mtime > max_age_s:
                shutil.rmtree(old)
                removed.append(old)
        except OSError:  # another process pruned or rebuilt it meanwhile
            continue
    return removed


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("model name", "flags"))), platform.processor())
    except OSError:
        return platform.processor()


def usable(q: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the kernel serves this call: a CPU tensor, a boolean mask, the kernel on and built."""
    return (q.device.type == "cpu" and mask is not None and mask.dtype == torch.bool and enabled()
            and kernel() is not None)
