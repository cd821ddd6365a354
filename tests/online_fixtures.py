"""Tiny models and a synthetic, shiftable sequence distribution for the online-drafter tests.

Sequences come from an order-1 Markov chain over a small vocabulary in which every token has a few
likely successors; a chain built from another seed is the *shifted* distribution the policy drifts
to. A tiny Llama learns such a chain in ~100 AdamW steps on CPU.
"""

from __future__ import annotations

import torch
from tiny_models import build_lm
from transformers import LlamaForCausalLM

VOCAB = 32


def tiny_llama(hidden: int, layers: int, seed: int, vocab: int = VOCAB) -> LlamaForCausalLM:
    return build_lm(attn="eager", vocab=vocab, hidden=hidden, layers=layers, seed=seed, logit_scale=1.0,
                    num_key_value_heads=4, max_position_embeddings=128)


def markov_chain(seed: int, vocab: int = VOCAB, fanout: int = 4) -> torch.Tensor:
    """Transition matrix [V, V]: each row puts all its mass on `fanout` random successors."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.stack([torch.randperm(vocab, generator=g)[:fanout] for _ in range(vocab)])  # [V, f]
    weights = torch.rand(vocab, fanout, generator=g) + 0.3  # [V, f]
    return torch.zeros(vocab, vocab).scatter(1, successors, weights / weights.sum(1, keepdim=True))


def sample_sequences(chain: torch.Tensor, num: int, length: int, g: torch.Generator) -> torch.Tensor:
    """[num, length] token ids: a uniform first token, then the chain."""
    token = torch.randint(chain.shape[0], (num,), generator=g)
    out = [token]
    for _ in range(length - 1):
        token = torch.multinomial(chain[token], 1, generator=g)[:, 0]
        out.append(token)
    return torch.stack(out, 1)


def train_lm(model: torch.nn.Module, chain: torch.Tensor, steps: int, lr: float, g: torch.Generator,
             batch: int = 32, length: int = 32) -> None:
    """Next-token cross-entropy on fresh samples of `chain` (pretraining, or a policy update)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        ids = sample_sequences(chain, batch, length, g)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def distill_lm(student: torch.nn.Module, teacher: torch.nn.Module, chain: torch.Tensor, steps: int, lr: float,
               g: torch.Generator, batch: int = 32, length: int = 32) -> None:
    """Forward KL to the teacher's full next-token distribution on samples of `chain` (drafter init)."""
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr)
    student.train()
    for _ in range(steps):
        ids = sample_sequences(chain, batch, length, g)
        with torch.no_grad():
            p = teacher(input_ids=ids).logits.softmax(-1)  # [B, L, V]
        loss = -(p * student(input_ids=ids).logits.log_softmax(-1)).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    student.eval()


def shifted_chain(chain: torch.Tensor, seed: int, sharpness: float = 2.0) -> torch.Tensor:
    """The drift target: same successors as `chain`, their weights shuffled and sharpened.

    Like an RL update it reweights what the policy already says instead of teaching new tokens,
    so the drifting policy stays peaked; a drafter frozen at `chain` still loses acceptance.
    """
    g = torch.Generator().manual_seed(seed)
    shifted = torch.zeros_like(chain)
    for row in range(chain.shape[0]):
        support = chain[row].nonzero()[:, 0]  # [f]
        weights = chain[row, support][torch.randperm(len(support), generator=g)] ** sharpness
        shifted[row, support] = weights / weights.sum()
    return shifted
