"""Token trees, part by part: the tree mask, the kept path's compaction, growing a tree, and the tree accept rules.

The rules' lossless test is direct: one step's first emitted token over many rows of one synthetic (p, q, tree)
must follow p (χ², α = 1e-3 per test: a correct rule fails a given test with probability 1e-3; the seeds are
fixed, so a run is deterministic), and the same test must reject the deliberately wrong rule that keeps
r = p for every sibling (its p-value at the same size is astronomically small: the test has the power to see it).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from tiny_models import make_prompts, tiny_lm

from specroll.rollout.drafters.tree_draft import grow_tree
from specroll.rollout.models.rows import RowIds
from specroll.rollout.models.runner import ModelRunner
from specroll.rollout.models.tree_mask import TreeAttention
from specroll.rollout.sampling.draft_q import DraftQ
from specroll.rollout.sampling.draft_tree import DraftTree
from specroll.rollout.sampling.noise import StepNoise
from specroll.rollout.sampling.randomness import request_keys
from specroll.rollout.sampling.tree_accept import TreeInvariant, TreeRejection
from specroll.tools.arch_sweep import tiny_model

CPU = torch.device("cpu")
ALPHA = 1e-3
# A tree of depth 2, width 3: root → nodes 1, 2 (siblings, one draw without replacement) and 3 (a fresh draw);
# level 2: node 4 under 1, nodes 5, 6 under 3.
PARENTS = [0, 0, 0, 1, 3, 3]
FRESH = [True, False, True, True, True, False]


def runner(model, paged: bool = False) -> ModelRunner:
    from specroll.rollout.models.paged import PagedLayout

    layout = PagedLayout(num_blocks=64, block_size=4) if paged else None
    return ModelRunner(model, 2, 48, torch.float32, CPU, paged=layout)


def tree_forward(run: ModelRunner, context: list[int], tokens: list[int]):
    """Fill the context but its last token, then feed [last, *tokens] as the PARENTS tree; logits [1, N, V]."""
    count = torch.tensor([len(context) - 1])
    run.extend(RowIds.of([0], CPU), torch.tensor([context]), count)
    start = run.cache.lens[:1].clone()
    parents = torch.tensor([PARENTS])
    tree = DraftTree(parents, torch.tensor([FRESH]), torch.ones(1, 6, dtype=torch.bool), 3, 2)
    positions = start[:, None] + tree.node_depths(CPU)
    ids = torch.tensor([[context[-1], *tokens]])
    attention = TreeAttention(start, tree.ancestors(), positions, positions)
    return run.forward(slice(0, 1), ids, start, tree=attention), start


def path_of(node: int) -> list[int]:
    path = []
    while node:
        path.append(node)
        node = PARENTS[node - 1]
    return path[::-1]


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral", "gpt2"])  # lean, HF, a sliding window, absolute
def test_each_node_sees_its_context_and_ancestors_only(model_type):
    model = tiny_lm(model_type, "sdpa") if model_type in ("llama", "qwen3") else tiny_model(model_type)
    vocab = model.config.vocab_size
    context, tokens = make_prompts(1, 9, 9, vocab=vocab, seed=4)[0], [5, 7, 9, 11, 13, 2]
    logits, _ = tree_forward(runner(model), context, tokens)
    for node in range(7):
        chain = runner(model)
        path = [context[-1], *[tokens[i - 1] for i in path_of(node)]]
        chain.extend(RowIds.of([0], CPU), torch.tensor([context]), torch.tensor([len(context) - 1]))
        expected = chain.feed(slice(0, 1), torch.tensor([path]))[0, -1]
        torch.testing.assert_close(logits[0, node], expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_compaction_leaves_the_kept_path_where_a_chain_writes_it(paged):
    model = tiny_lm("llama", "sdpa")
    context, tokens = make_prompts(1, 7, 7, seed=5)[0], [5, 7, 9, 11, 13, 2]
    run = runner(model, paged)
    _, start = tree_forward(run, context, tokens)
    path = [0, 3, 5]  # root, node 3, node 5
    s = int(start)
    run.cache.compact(slice(0, 1), start[:, None] + torch.tensor([path]), start[:, None] + torch.arange(3)[None])
    chain = runner(model, paged)
    chain.extend(RowIds.of([0], CPU), torch.tensor([context]), torch.tensor([len(context) - 1]))
    chain.feed(slice(0, 1), torch.tensor([[context[-1], tokens[2], tokens[4]]]))
    for kept, ref in zip(run.cache.layers, chain.cache.layers):
        if paged:  # the pools' slots of positions s .. s + 2, through each cache's own block table
            def at(cache, layer):
                table = cache.block_table[0]
                slots = torch.tensor([int(table[p // 4]) * 4 + p % 4 for p in range(s, s + 3)])
                return layer.keys.index_select(1, slots), layer.values.index_select(1, slots)
            for a, b in zip(at(run.cache, kept), at(chain.cache, ref)):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        else:
            torch.testing.assert_close(kept.keys[0, :, s : s + 3], ref.keys[0, :, s : s + 3], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(kept.values[0, :, s : s + 3], ref.values[0, :, s : s + 3], atol=1e-5, rtol=1e-4)


def step_noise(n: int, vocab: int, greedy: bool, width: int = 3) -> StepNoise:
    keys = request_keys(7, torch.arange(n), torch.zeros(n, dtype=torch.long))
    return StepNoise(keys, torch.full((n,), 10), width, vocab, greedy)


@pytest.mark.parametrize("greedy", [True, False])
def test_grown_tree_is_level_ordered_and_its_first_child_is_the_chain_draft(greedy):
    n, vocab, width, depth = 64, 12, 3, 3
    gen = torch.Generator().manual_seed(0)
    root = torch.rand(n, vocab, generator=gen).softmax(-1)
    noise = step_noise(n, vocab, greedy, depth + 1)

    def expand(tokens, parents, level):
        return torch.rand(n, width, vocab, generator=gen).softmax(-1)

    grown = grow_tree(root, depth, width, expand, noise)
    tree = grown.tree
    assert tree.parents.shape == grown.drafts.shape == (n, depth * width)
    for level in range(depth):  # each node's parent sits on the level above; siblings are contiguous
        cols = slice(level * width, (level + 1) * width)
        lo, hi = (0, 0) if level == 0 else ((level - 1) * width + 1, level * width)
        assert bool(((tree.parents[:, cols] >= lo) & (tree.parents[:, cols] <= hi)).all())
        assert bool((tree.parents[:, cols].diff(dim=1) >= 0).all())
        starts = torch.cat([torch.ones(n, 1, dtype=torch.bool), tree.parents[:, cols].diff(dim=1) != 0], 1)
        assert torch.equal(tree.fresh[:, cols], starts)  # a parent's first child starts its draw
    # The root's first child is the chain's draft: the same Gumbel-max with the same noise.
    assert torch.equal(grown.drafts[:, 0], noise.draw_draft(root, 0))
    first = grown.drafts[:, :width]
    assert all(len(set(row)) == width for row in first.tolist())  # without replacement: distinct siblings


def synthetic_step(n: int, vocab: int = 5, seed: int = 1):
    """One depth-2 PARENTS tree per row: p at every node, the q each node was drawn from, and the drafts — the root's
    first two children a Gumbel-top-2 draw from q_root (without replacement), every other node a fresh draw."""
    gen = torch.Generator().manual_seed(seed)
    p_nodes = torch.rand(7, vocab, generator=gen)
    p_nodes /= p_nodes.sum(-1, keepdim=True)
    q = torch.rand(3, vocab, generator=gen)  # q_root, then the fresh draws' laws
    q /= q.sum(-1, keepdim=True)
    noise = step_noise(n, vocab, greedy=False)
    root_pair = noise.draw_top(q[0].expand(n, 1, vocab), 0, 2)[:, 0]  # [n, 2]
    fresh_draw = torch.multinomial(q[1].expand(n, vocab), 1, generator=gen)[:, 0]
    level2 = torch.multinomial(q[2].expand(n, vocab), 3, replacement=True, generator=gen)  # [n, 3] independent
    drafts = torch.cat([root_pair, fresh_draw[:, None], level2], 1)  # [n, 6]
    probs = torch.stack([q[0], q[0], q[1], q[2], q[2], q[2]])[None].expand(n, -1, -1).contiguous()
    fresh = torch.tensor([True, False, True, True, True, True])
    tree = DraftTree(torch.tensor([PARENTS]).expand(n, -1), fresh[None].expand(n, -1),
                     torch.ones(n, 6, dtype=torch.bool), 3, 2)
    return drafts, DraftQ.over(probs, None, vocab), p_nodes[None].expand(n, -1, -1), noise, tree


@pytest.mark.parametrize("rule", [TreeRejection(), TreeRejection(update_residual=False)], ids=["lossless", "wrong"])
def test_recursive_rejection_over_siblings_emits_the_target_law(rule):
    n, vocab = 200_000, 5
    drafts, q, p, noise, tree = synthetic_step(n, vocab)
    verdict = rule.verify(drafts, q, p, noise, tree, tree.valid)
    first = verdict.tokens[:, 0]  # the token after the root: law p_root under a lossless rule
    observed = torch.bincount(first, minlength=vocab).double()
    expected = p[0, 0].double() / p[0, 0].double().sum() * observed.sum()
    pvalue = chisquare(observed.numpy(), expected.numpy()).pvalue
    if rule.update_residual:
        assert pvalue > ALPHA
        assert 0.2 < float((verdict.accepted_len > 0).double().mean()) < 0.95  # siblings really are tried
    else:
        assert pvalue < ALPHA


def test_invariant_descent_keeps_the_child_equal_to_the_targets_draw():
    n, vocab = 4096, 5
    drafts, q, p, noise, tree = synthetic_step(n, vocab)
    verdict = TreeInvariant().verify(drafts, q, p, noise, tree, tree.valid)
    target_first = p[:, 0].log().add(noise.token_row(0)).argmax(-1)
    assert torch.equal(verdict.tokens[:, 0], target_first)  # plain decoding's token, whatever was drafted
    kept = verdict.accepted_len > 0
    assert torch.equal(kept, (drafts[:, :3] == target_first[:, None]).any(1))


def test_greedy_rejection_walks_the_tree_as_the_invariant_rule():
    n, vocab = 256, 5
    drafts, q, p, _, tree = synthetic_step(n, vocab)
    greedy = StepNoise(torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), 3, vocab, True)
    a = TreeRejection().verify(drafts, q, p, greedy, tree, tree.valid)
    b = TreeInvariant().verify(drafts, q, p, greedy, tree, tree.valid)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted_len, b.accepted_len)
    assert torch.equal(a.tokens[:, 0], p[:, 0].argmax(-1))


def test_suffix_index_gives_several_continuations_where_siblings_disagree():
    from specroll.rollout.config import SuffixConfig
    from specroll.rollout.drafters.suffix_index import CompletionIndex

    index = CompletionIndex(3, SuffixConfig())
    prompt = [1, 2, 3]
    for slot, completion in enumerate([[4, 5, 6, 7], [4, 5, 9, 9], [4, 5]]):  # two siblings disagree after 4 5
        index.start(slot, prompt)
        index.extend(slot, completion)
    found = index.lookup_several(2, 3, 4)
    assert sorted(tokens for tokens, _ in found) == [[6, 7], [9, 9]]
    assert all(match >= 2 for _, match in found)
    assert index.lookup_several(2, 3, 1) == found[:1]
