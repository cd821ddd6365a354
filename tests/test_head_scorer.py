"""The head scorer takes the LM head at completion positions only, through the draft vocabulary's rows: for every
head objective (EAGLE, Medusa, EAGLE-3 on the target's head and on its own) its acceptance and losses equal the
whole [B, D, L, V] log q restricted after (`Scorer.restricted`, what it computed before), ids outside the subset
read as q = 0, and the gradients reaching the head are the same."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_lm

from specroll.online_drafter.divergence import LOSSES, expected_acceptance
from specroll.online_drafter.heads.data import FeatureBatch
from specroll.online_drafter.heads.objectives import objective_for
from specroll.online_drafter.heads.scorer import HeadScorer, completion_index
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

T = 0.8


def _target():
    return tiny_lm("llama", "sdpa", layers=4, logit_scale=4.0)


def _head(kind: str, target):
    torch.manual_seed(3)
    if kind == "eagle":
        return EagleHead.for_target(target.config, seed=1)
    if kind == "medusa":
        return MedusaHeads(target.config.hidden_size, 3)
    ids = None
    if kind == "eagle3-own":  # its own LM head over 40 draft ids (as a public checkpoint's d2t)
        ids = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(2))[:40].sort().values
    return Eagle3Head.for_target(target.config, (0, 2), draft_ids=ids, ttt_steps=2)


def _batch(head, target, seed: int = 0) -> FeatureBatch:
    """Three sequences of different prompt and completion lengths (right-padded), random features and top-k p."""
    g = torch.Generator().manual_seed(seed)
    vocab, width = target.config.vocab_size, target.config.hidden_size
    width *= len(head.target_layers) if isinstance(head, Eagle3Head) else 1
    size, length, k = 3, 14, 6
    prompts, ends = [3, 5, 2], [14, 11, 9]
    token_ids = torch.randint(1, vocab, (size, length), generator=g)
    hidden = torch.randn(size, length - 1, width, generator=g)
    weights = torch.zeros(size, length)
    topk_probs = torch.zeros(size, length, k)
    for b, (start, end) in enumerate(zip(prompts, ends)):
        token_ids[b, end:] = 0
        hidden[b, end - 1:] = 0
        weights[b, start:end] = 1.0 / (end - start)
        p = torch.rand(end - start, k, generator=g)
        topk_probs[b, start:end] = p / p.sum(-1, keepdim=True) * 0.9  # a tail bucket of 0.1
    topk_ids = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(size * length)]).view(size, length, k)
    return FeatureBatch(token_ids, hidden, topk_ids, topk_probs, weights)


def _reference(scorer: HeadScorer, head, batch: FeatureBatch, loss_fn, depths=None):
    """What the scorer computed before: the whole log q [B, D, L, V], restricted, read at every position."""
    out = scorer.objective(head, batch, T, depths)
    log_q = scorer.restricted(out.log_q)
    per_position = torch.stack([loss_fn(log_q[:, d], batch.topk_ids, batch.topk_probs)
                                for d in range(log_q.shape[1])], 1)
    loss = (per_position * batch.weights[:, None]).sum() / (batch.weights.sum() * log_q.shape[1]) + out.aux_loss
    acceptance = torch.stack([expected_acceptance(log_q[:, d], batch.topk_ids, batch.topk_probs)
                              for d in range(log_q.shape[1])], 1).mean(1)
    return loss, acceptance


def _gradients(head, value: torch.Tensor) -> dict[str, torch.Tensor]:
    head.zero_grad()
    value.backward()
    return {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("vocab", [None, "subset"])
@pytest.mark.parametrize("kind", ["eagle", "medusa", "eagle3", "eagle3-own"])
def test_completion_positions_through_the_draft_vocabulary_score_and_train_as_the_full_head(kind, vocab):
    target = _target()
    head = _head(kind, target)
    batch = _batch(head, target)
    objective = objective_for(head, target.get_input_embeddings(), target.get_output_embeddings())
    scorer = HeadScorer(objective, T, batch_size=4, recency_decay=1.0, device=torch.device("cpu"))
    size = target.config.vocab_size
    ids = None if vocab is None else torch.randperm(size, generator=torch.Generator().manual_seed(1))[: size // 3]
    mask = batch.weights > 0
    assert ids is None or (~torch.isin(batch.topk_ids[mask], ids)).any()  # the subset misses ids p puts mass on
    with scorer.over(ids):
        scored = scorer.scored(head, batch)
        if ids is not None and kind != "eagle3-own":
            assert scored.log_q.shape[-1] == ids.numel()  # the head's N rows, not V
        assert scored.log_q.shape[2] == int(mask.sum(1).max())  # completion positions only
        for name, loss_fn in LOSSES.items():
            expected_loss, _ = _reference(scorer, head, batch, loss_fn)
            torch.testing.assert_close(scorer.loss(head, batch, loss_fn), expected_loss, atol=1e-5, rtol=1e-5,
                                       msg=name)
            new = _gradients(head, scorer.loss(head, batch, loss_fn))
            old = _gradients(head, _reference(scorer, head, batch, loss_fn)[0])
            assert new.keys() == old.keys() and new
            for param in new:
                torch.testing.assert_close(new[param], old[param], atol=1e-5, rtol=1e-4, msg=f"{name}: {param}")
        with torch.no_grad():
            _, expected = _reference(scorer, head, batch, LOSSES["kl"])
            got = scorer.acceptance(head, batch)
        torch.testing.assert_close(got * batch.weights, expected * batch.weights, atol=1e-6, rtol=1e-5)
        assert (got[~mask] == 0).all()


def test_completion_index_lists_each_rows_weighted_positions_first_and_distinct():
    weights = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 1, 1], [0, 0, 0, 0, 1.0]])
    index = completion_index(weights)
    assert index.tolist() == [[2, 3, 0], [1, 3, 4], [4, 0, 1]]
    assert all(len(set(row)) == len(row) for row in index.tolist())
