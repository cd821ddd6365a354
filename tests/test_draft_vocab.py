"""Draft vocabularies: a drafter over a subset of the target's ids changes the cost of drafts, never the output.

Greedy exactness for every drafter with an LM head (an independent LM, layer-skip, the EAGLE-style head,
Medusa heads, and the LM with the suffix drafter's per-row choice) at a subset that leaves out tokens the
target emits often: the output is plain decoding's token for token, no draft ever lies outside the subset,
and drafts are still kept. The invariant sampler gives plain decoding's sampled tokens for the seed with a
subset too. The distribution tests (`test_engine_distribution`, `test_feature_drafters_distribution`) cover
rejection sampling with a subset. Then the pieces: `DraftQ`'s compact forms agree with the dense q they
stand for; a subset travels in the drafter's state dict (the learner's publish path); the subset's head rows
follow the head's weights when the policy is updated in place; bad settings are refused early.
"""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from tiny_models import VOCAB, make_prompts, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.draft_vocab import DraftVocab, first_ids, top_ids
from specroll.rollout.drafters.version import DrafterVersion
from specroll.rollout.sampling.draft_q import DraftQ

PROMPTS = make_prompts(12, 2, 9, seed=5)
GREEDY = SamplingParams(max_new_tokens=24, temperature=0)
SAMPLED = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
SIZE = 24  # of VOCAB = 64


def plain(params: SamplingParams) -> list[list[int]]:
    engine = SpecEngine(tiny_lm("llama", layers=3), None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=0))
    return [r.completion_ids for r in engine.generate(PROMPTS, params)]


def subset_missing_frequent_tokens(params: SamplingParams) -> torch.Tensor:
    """SIZE ids: the most frequent tokens of plain decoding's output, except its 3 most frequent (which the
    target then emits without the drafter ever proposing them)."""
    counts = collections.Counter(t for row in plain(params) for t in row)
    ranked = [t for t, _ in counts.most_common()] + [t for t in range(VOCAB) if t not in counts]
    return torch.tensor(sorted(ranked[3 : 3 + SIZE]))


class DraftLog:
    """Keeps every draft the engine's drafter with an LM head proposed (with the suffix drafter: the model's;
    the suffix's point masses come from earlier text and may be any token)."""

    def __init__(self, engine: SpecEngine):
        self.drafts: list[torch.Tensor] = []
        drafter = getattr(engine.drafter, "model", engine.drafter)
        propose = drafter.propose

        def logged(*args, **kwargs):
            proposal = propose(*args, **kwargs)
            self.drafts.append(proposal.drafts.flatten())
            return proposal

        drafter.propose = logged

    def all(self) -> torch.Tensor:
        return torch.cat(self.drafts) if self.drafts else torch.empty(0, dtype=torch.long)


def make_engine(kinds: tuple[str, ...], sampler: str = "rejection") -> SpecEngine:
    target = tiny_lm("llama", layers=3)
    drafter = noisy_copy_of(target) if "model" in kinds else None
    config = EngineConfig(max_batch_size=5, max_seq_len=40, gamma=3, drafters=kinds, draft_vocab=SIZE,
                          sampler=sampler, layer_skip_layers=2)
    return SpecEngine(target, drafter, config)


def noisy_copy_of(target: torch.nn.Module) -> torch.nn.Module:
    """The target with noise on its LM head: a drafter LM that agrees with it on most tokens."""
    model = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        w = model.lm_head.weight
        w.add_(0.03 * w.std() * torch.randn(w.shape, generator=gen))
    return model


KINDS = [("model",), ("layer_skip",), ("eagle",), ("medusa",), ("model", "suffix")]


@pytest.mark.parametrize("kinds", KINDS, ids="+".join)
def test_greedy_with_a_draft_vocabulary_equals_plain_decoding(kinds):
    ids = subset_missing_frequent_tokens(GREEDY)
    engine = make_engine(kinds)
    engine.set_draft_vocab(DraftVocab(torch.as_tensor(ids), engine.vocab_size))
    log = DraftLog(engine)
    out = [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)]
    assert out == plain(GREEDY)
    emitted = torch.tensor([t for row in out for t in row])
    assert (~torch.isin(emitted, ids)).float().mean() > 0.2  # the target often emits what the drafter cannot
    drafts = log.all()
    assert drafts.numel() > 0 and bool(torch.isin(drafts, ids).all())  # no draft outside the subset
    if kinds[0] in ("model", "layer_skip"):  # these agree with the target often: subset drafts are still kept
        assert engine.stats.acceptance_rate > 0.2


@pytest.mark.parametrize("kinds", [("model",), ("eagle",)], ids="+".join)
def test_invariant_sampler_with_a_draft_vocabulary_gives_plain_decodings_tokens(kinds):
    engine = make_engine(kinds, sampler="invariant")
    engine.set_draft_vocab(DraftVocab(torch.as_tensor(subset_missing_frequent_tokens(SAMPLED)), engine.vocab_size))
    assert [r.completion_ids for r in engine.generate(PROMPTS, SAMPLED)] == plain(SAMPLED)


def test_first_subset_holds_the_first_ids_and_the_stop_ids():
    target = tiny_lm("llama", layers=3)
    engine = SpecEngine(target, noisy_copy_of(target), EngineConfig(max_batch_size=2, max_seq_len=40, gamma=2,
                                                                    draft_vocab=8))
    expected = first_ids(8, VOCAB, always=[target.config.eos_token_id])  # `initial_ids`
    assert torch.equal(engine.draft_vocab(), expected)
    assert target.config.eos_token_id in expected.tolist() and expected.numel() == 8


def test_a_drafter_version_carries_its_subset():
    target = tiny_lm("llama", layers=3)
    drafter = noisy_copy_of(target)
    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=3, draft_vocab=SIZE))
    new = torch.arange(40, 40 + SIZE)
    engine.load_drafter(DrafterVersion(1, drafter.state_dict(), new))
    assert torch.equal(engine.draft_vocab(), new)
    log = DraftLog(engine)
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == plain(GREEDY)
    assert bool(torch.isin(log.all(), new).all())


def test_subset_head_rows_follow_an_in_place_policy_update():
    vocab = DraftVocab(torch.tensor([1, 5, 9]), VOCAB)
    head = torch.nn.Linear(8, VOCAB, bias=False)
    hidden = torch.randn(2, 8)
    torch.testing.assert_close(vocab.logits(hidden, head), head(hidden)[:, [1, 5, 9]])
    with torch.no_grad():
        head.weight.mul_(2.0)  # as `copy_into` writes a new policy: in place
    torch.testing.assert_close(vocab.logits(hidden, head), head(hidden)[:, [1, 5, 9]])


def test_compact_q_forms_agree_with_the_dense_q():
    gen = torch.Generator().manual_seed(0)
    n, gamma, vocab = 6, 3, 20
    ids = torch.tensor([0, 2, 3, 7, 11, 19])
    probs = torch.rand(n, gamma, ids.numel(), generator=gen).softmax(-1)
    drafts = ids[torch.randint(ids.numel(), (n, gamma), generator=gen)]
    drafts[0, 1] = 5  # a point row's draft may lie anywhere
    sub = DraftQ.over(probs, ids, vocab)
    dense = torch.zeros(n, gamma, vocab)
    dense[..., ids] = probs
    torch.testing.assert_close(sub.expanded(drafts), dense)
    mixed = DraftQ.over(probs[[1, 3, 4]], ids, vocab).select(torch.tensor([1, 3, 4]), n)
    expected = torch.nn.functional.one_hot(drafts, vocab).float()
    expected[[1, 3, 4]] = dense[[1, 3, 4]]
    torch.testing.assert_close(mixed.expanded(drafts), expected)
    for q, full in ((sub, dense), (mixed, expected), (DraftQ.over(dense, None, vocab), dense)):
        torch.testing.assert_close(q.of(drafts), full.gather(-1, drafts[..., None])[..., 0])
        col, use = torch.tensor([0, 1, 2, 2, 1, 0]), torch.tensor([True, True, False, True, True, True])
        want = full[torch.arange(n), col] * use[:, None]
        torch.testing.assert_close(q.row(drafts, col, use), want)


def test_top_ids_takes_the_most_counted_and_the_required_ones():
    counts = torch.tensor([5.0, 0.0, 9.0, 9.0, 1.0, 7.0])
    assert top_ids(counts, 3).tolist() == [2, 3, 5]
    assert top_ids(counts, 3, always=[1]).tolist() == [1, 2, 3]
    assert first_ids(2, 6, always=[5]).tolist() == [0, 5]


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(draft_vocab=0), "draft_vocab=0 is invalid"),
    (dict(draft_vocab=True), "draft_vocab=True is invalid"),
    (dict(draft_vocab=VOCAB + 1), rf"draft_vocab={VOCAB + 1} is invalid: an int in \[1, {VOCAB}\]"),
    (dict(draft_vocab=8, drafters=("suffix",)), "needs a drafter with an LM head"),
])
def test_bad_settings_are_refused_early(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpecEngine(tiny_lm("llama", layers=3), None, EngineConfig(max_batch_size=2, max_seq_len=40, gamma=2,
                                                                  **kwargs))


def test_bad_subsets_are_refused():
    with pytest.raises(ValueError, match=r"must lie in \[0, 64\)"):
        DraftVocab(torch.tensor([3, 64]), VOCAB)
    with pytest.raises(ValueError, match="1-D int tensor"):
        DraftVocab(torch.tensor([1.0, 2.0]), VOCAB)
