"""Supervised training of the demo models: next-token cross-entropy or distillation to soft targets.

One loop serves every stage of the build (core SFT, target fine-tune, drafter fit and distillation).
An `Example` is a token sequence whose first `prompt_len` tokens are context (no loss); with `soft`
the loss at each completion token is the cross-entropy to the teacher's distribution there (forward
KL up to the teacher's entropy), else to the token itself. Batches are drawn from length-sorted
chunks, because the task's long-tailed lengths would otherwise make most of a batch padding.

At a 32k vocabulary the LM head dominates a small model's training cost, so with `negatives` > 0 the
loss is a sampled softmax (Jean et al. 2015, "On Using Very Large Target Vocabulary"): the head is
applied at the loss positions only, over the batch's own target ids plus `negatives` ids drawn
uniformly per step; each drawn negative stands for its share of the ids left out (its logit gets
+log(left-out / drawn)), so the normaliser is an unbiased estimate of the full one and every entry is
pushed down now and then. Teacher distributions may be sparse (`soft_ids`: the teacher's top-k ids).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from .recipe import TrainStage


@dataclass
class Example:
    """`ids` [L]; loss on `ids[prompt_len:]`; `soft` teacher probs, [L - prompt_len, V] or, with
    `soft_ids` [L - prompt_len, k] (the ids they belong to), [L - prompt_len, k]; None: hard targets."""

    ids: list[int]
    prompt_len: int
    soft: torch.Tensor | None = None
    soft_ids: torch.Tensor | None = None


@dataclass
class TrainLog:
    """Loss per step (mean over completion tokens) and the wall time of the stage."""

    losses: list[float]
    seconds: float


def train(model: PreTrainedModel, examples: list[Example], stage: TrainStage, pad_id: int, seed: int,
          desc: str, progress: bool = True, negatives: int = 0) -> TrainLog:
    """Run `stage.steps` AdamW steps on batches of `examples` (a sampled softmax with `negatives` > 0);
    the model is left in eval mode."""
    if stage.steps == 0:
        return TrainLog([], 0.0)
    if not examples:
        raise ValueError(f"{desc}: no training examples")
    started = time.perf_counter()
    torch.manual_seed(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(50, stage.steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, warmup, stage.steps))
    batches = _batches(examples, stage.batch_size, random.Random(seed))
    losses = []
    with tqdm(total=stage.steps, desc=desc, disable=not progress, leave=False) as bar:
        for _ in range(stage.steps):
            batch = next(batches)
            sparse = negatives > 0 or batch[0].soft_ids is not None
            loss = sparse_batch_loss(model, batch, pad_id, negatives) if sparse else batch_loss(model, batch, pad_id)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return TrainLog(losses, time.perf_counter() - started)


def batch_loss(model: PreTrainedModel, batch: list[Example], pad_id: int) -> torch.Tensor:
    """Mean loss over the completion tokens of `batch` (right-padded into one forward)."""
    width = max(len(ex.ids) for ex in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, L]
    in_loss = torch.zeros(len(batch), width, dtype=torch.bool)  # [B, L]: token t is a loss target
    for row, ex in enumerate(batch):
        ids[row, : len(ex.ids)] = torch.tensor(ex.ids)
        in_loss[row, ex.prompt_len : len(ex.ids)] = True
    attention_mask = (torch.arange(width)[None, :] < torch.tensor([len(ex.ids) for ex in batch])[:, None]).long()
    logits = model(input_ids=ids, attention_mask=attention_mask).logits[:, :-1].float()  # [B, L-1, V]
    logp = logits.log_softmax(-1)
    targets, mask = ids[:, 1:], in_loss[:, 1:]  # logits at t predict token t + 1
    if batch[0].soft is None:
        per_token = -logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, L-1]
        return per_token[mask].mean()
    soft = torch.zeros_like(logp)  # [B, L-1, V]
    for row, ex in enumerate(batch):
        soft[row, ex.prompt_len - 1 : len(ex.ids) - 1, : ex.soft.shape[1]] = ex.soft
    per_token = -(soft * logp).sum(-1)  # [B, L-1]
    return per_token[mask].mean()


def sparse_batch_loss(model: PreTrainedModel, batch: list[Example], pad_id: int, negatives: int) -> torch.Tensor:
    """`batch_loss` with the head applied at the loss positions only, over the batch's target ids plus
    `negatives` uniform draws (all ids when `negatives` is 0). A Llama-style model: `model.model` is the
    decoder and the output embeddings have no bias."""
    width = max(len(ex.ids) for ex in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, L]
    in_loss = torch.zeros(len(batch), width, dtype=torch.bool)  # [B, L]
    for row, ex in enumerate(batch):
        ids[row, : len(ex.ids)] = torch.tensor(ex.ids)
        in_loss[row, ex.prompt_len : len(ex.ids)] = True
    attention_mask = (torch.arange(width)[None, :] < torch.tensor([len(ex.ids) for ex in batch])[:, None]).long()
    hidden = model.model(input_ids=ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
    mask = in_loss[:, 1:]
    hidden = hidden[:, :-1][mask]  # [N, H]: positions whose next token is a loss target
    head = model.get_output_embeddings().weight  # [V, H]
    if batch[0].soft is None:
        target_ids = ids[:, 1:][mask][:, None]  # [N, 1]
        target_probs = torch.ones_like(target_ids, dtype=hidden.dtype)  # [N, 1]
    else:
        target_ids = torch.cat([ex.soft_ids for ex in batch]).long()  # [N, k]
        target_probs = torch.cat([ex.soft for ex in batch]).to(hidden.dtype)  # [N, k]
    vocab = head.shape[0]
    if negatives == 0:
        logp = (hidden @ head.T).float().log_softmax(-1)  # [N, V]
        return -(target_probs * logp.gather(-1, target_ids)).sum(-1).mean()
    positives = target_ids.unique()  # [P], sorted
    drawn = torch.randint(vocab, (negatives,))
    drawn = drawn[~torch.isin(drawn, positives)].unique()  # [M]
    candidates = torch.cat([positives, drawn])  # [C]
    correction = torch.zeros(len(candidates))  # [C]
    if len(drawn):
        correction[len(positives):] = math.log((vocab - len(positives)) / len(drawn))
    logp = ((hidden @ head[candidates].T).float() + correction).log_softmax(-1)  # [N, C]
    column = torch.searchsorted(positives, target_ids)  # [N, k]: each target's candidate column
    return -(target_probs * logp.gather(-1, column)).sum(-1).mean()


def _batches(examples: list[Example], batch_size: int, rng: random.Random) -> Iterator[list[Example]]:
    """Endless batches: shuffle, cut chunks of 16 batches, sort each chunk by length, shuffle batches."""
    chunk = 16 * batch_size
    while True:
        order = examples[:]
        rng.shuffle(order)
        for start in range(0, len(order), chunk):
            part = sorted(order[start : start + chunk], key=lambda ex: len(ex.ids))
            group = [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
            rng.shuffle(group)
            yield from group


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
