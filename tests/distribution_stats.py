"""The lossless-sampling statistic shared by the distribution tests (see test_engine_distribution.py's
docstring): the exact processed p_t at every generated position, and the conditional χ² of the
emitted tokens against them. Significance `ALPHA` per test."""

from __future__ import annotations

import torch
from scipy.stats import chi2
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specroll.rollout import SamplingParams

ALPHA = 1e-3


def reference_probs(model, rollouts, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact processed p_t at every generated position [N, V] and the emitted tokens [N]."""
    warpers = [TemperatureLogitsWarper(params.temperature)]
    if params.top_k:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    probs, tokens = [], []
    by_len: dict[int, list] = {}
    for r in rollouts:  # equal lengths batch without padding
        by_len.setdefault(len(r.prompt_ids), []).append(r)
    with torch.no_grad():
        for length, group in by_len.items():
            ids = torch.tensor([r.prompt_ids + r.completion_ids for r in group])  # [b, L]
            logits = model(ids).logits[:, length - 1 : -1].flatten(0, 1)  # [b·T, V]
            for warp in warpers:
                logits = warp(None, logits)
            probs.append(logits.softmax(-1))
            tokens.append(ids[:, length:].reshape(-1))
    return torch.cat(probs).double(), torch.cat(tokens)


def conditional_chi2_pvalue(probs: torch.Tensor, tokens: torch.Tensor) -> float:
    observed = torch.nn.functional.one_hot(tokens, probs.shape[1]).double()  # [N, V]
    s = (observed - probs).sum(0)  # [V]
    cov = torch.diag(probs.sum(0)) - probs.T @ probs  # [V, V]
    dof = int(torch.linalg.matrix_rank(cov, hermitian=True))
    stat = float(s @ torch.linalg.pinv(cov, hermitian=True) @ s)
    return float(chi2.sf(stat, dof))
