"""The learner's compute dtype (`LearnerConfig.compute_dtype`), "auto" resolved by what the device runs faster.

bf16 autocast is only a saving where the hardware multiplies in bf16: on a GPU since Ampere, and on CPUs with
AVX512-BF16 or AMX. Elsewhere torch emulates it, and it costs more than fp32 — measured on this project's 2-core
AMD EPYC (AVX2 only, torch 2.13): a [1200, 512] × [512, 2048] linear 33 ms in fp32, 265 ms under bf16 autocast,
and a fresh EAGLE head's learner step on the character demo ~8 s instead of ~1 s. The setting that once made the
head learner "2.8× cheaper a step" (measured on another CPU) made it 8× dearer here. "auto" therefore asks the
device: on CUDA whether it supports bf16; on a CPU it races one linear layer's forward and backward at the head
learner's shape in both dtypes (~0.1–0.5 s, once per process and device) and takes bf16 only if it is clearly
faster (`BF16_MARGIN`).
"""

from __future__ import annotations

import contextlib
import time

import torch

from .learner_config import COMPUTE_DTYPES

BF16_MARGIN = 0.8  # bf16 must take at most this fraction of fp32's time to be chosen
_RESOLVED: dict[str, torch.dtype | None] = {}  # device type -> the dtype "auto" chose there


def resolve(name: str, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype for `LearnerConfig.compute_dtype` `name` on `device` (None: fp32, no autocast)."""
    if name != "auto":
        return COMPUTE_DTYPES[name]
    device = torch.device(device)
    if device.type not in _RESOLVED:
        if device.type == "cuda":
            _RESOLVED[device.type] = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        elif device.type == "cpu":
            fp32, bf16 = race_cpu()
            _RESOLVED[device.type] = torch.bfloat16 if bf16 <= BF16_MARGIN * fp32 else None
        else:
            _RESOLVED[device.type] = None
    return _RESOLVED[device.type]


def context(name: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """Where the learner trains and gates: autocast to `resolve(name, device)`, or as it is (fp32)."""
    dtype, device = resolve(name, device), torch.device(device)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def race_cpu(rows: int = 512, width: int = 512, repeats: int = 3) -> tuple[float, float]:
    """Seconds of one linear [rows, width] → [rows, 4·width] forward + backward on the CPU, in fp32 and under
    bf16 autocast (the median of `repeats`, interleaved, after a warm-up each)."""
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(width, 4 * width)
    x = torch.randn(rows, width, generator=gen)
    times: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(repeats + 1):
        for bf16 in (False, True):
            context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            started = time.perf_counter()
            with context:
                out = layer(x)
            out.float().square().mean().backward()
            if repeat:  # the first of each is the warm-up
                times[bf16].append(time.perf_counter() - started)
            layer.zero_grad(set_to_none=True)
    return sorted(times[False])[repeats // 2], sorted(times[True])[repeats // 2]
