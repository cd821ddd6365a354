"""The drafter LM's scorer runs its LM head on completion positions through the draft vocabulary's rows only: its
acceptance and losses equal the full head's restricted after (`Scorer.restricted`), ids outside the subset read as
q = 0, and gradients reach the same rows; a soft-capped model (Gemma 2) takes its own forward."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_lm
from transformers import Gemma2Config, Gemma2ForCausalLM

from specroll.online_drafter.divergence import LOSSES, expected_acceptance
from specroll.online_drafter.lm.data import DraftBatch
from specroll.online_drafter.lm.scorer import DrafterScorer

V = 64


def _batch(seed: int = 0) -> DraftBatch:
    g = torch.Generator().manual_seed(seed)
    B, L, T, k = 3, 12, 6, 8
    probs = torch.rand(B, T, k, generator=g)
    probs = probs / probs.sum(-1, keepdim=True) * 0.95  # a tail bucket of 0.05
    return DraftBatch(input_ids=torch.randint(1, V, (B, L), generator=g),
                      loss_index=torch.arange(L - T - 1, L - 1).expand(B, T).clone(),
                      topk_ids=torch.stack([torch.randperm(V, generator=g)[:k] for _ in range(B * T)]).view(B, T, k),
                      topk_probs=probs, weights=torch.ones(B, T) / T)


def _gemma2():
    """Logits soft-capped after the head: the scorer must take the model's own forward."""
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, final_logit_softcapping=5.0,
                          tie_word_embeddings=False)
    return Gemma2ForCausalLM(config).float().eval()


def _full_path(scorer: DrafterScorer, drafter, batch: DraftBatch) -> torch.Tensor:
    """The full head over every position, gathered and restricted after: what the scorer did before."""
    logits = drafter(input_ids=batch.input_ids).logits
    index = batch.loss_index[..., None].expand(-1, -1, logits.shape[-1])
    return scorer.restricted((logits.gather(1, index).float() / scorer.temperature).log_softmax(-1))


@pytest.mark.parametrize("vocab", [None, "subset"])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_head_over_the_draft_vocabulary_scores_and_trains_as_the_full_head(arch, vocab):
    drafter = _gemma2() if arch == "gemma2" else build_lm(arch, vocab=V)
    scorer = DrafterScorer(temperature=0.8, batch_size=4, recency_decay=1.0, device=torch.device("cpu"))
    batch = _batch()
    ids = None if vocab is None else torch.randperm(V, generator=torch.Generator().manual_seed(1))[:V // 3]
    outside = 0 if ids is None else int((~torch.isin(batch.topk_ids, ids)).sum())
    assert ids is None or outside > 0  # the subset misses ids the target put mass on
    with scorer.over(ids):
        log_q = scorer.log_q(drafter, batch)
        assert log_q.shape[-1] == (V if ids is None else ids.numel())
        full = _full_path(scorer, drafter, batch)
        torch.testing.assert_close(expected_acceptance(log_q, scorer.ids(drafter, batch), batch.topk_probs),
                                   expected_acceptance(full, batch.topk_ids, batch.topk_probs), atol=1e-5, rtol=0)
        for name, loss_fn in LOSSES.items():
            grads = []
            for fast in (True, False):
                drafter.zero_grad()
                loss = (scorer.loss(drafter, batch, loss_fn) if fast else
                        (loss_fn(_full_path(scorer, drafter, batch), batch.topk_ids, batch.topk_probs)
                         * batch.weights).sum() / batch.weights.shape[0])
                loss.backward()
                grads.append(drafter.get_output_embeddings().weight.grad.clone())
            torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4, msg=name)
            assert grads[0].abs().sum() > 0
            if ids is not None:  # rows outside the subset get no gradient: q there is 0 whatever they are
                rest = torch.ones(V, dtype=torch.bool)
                rest[ids] = False
                # exactly 0 through the subset head; rounding after a full one
                assert grads[0][rest].abs().max() <= 1e-8
