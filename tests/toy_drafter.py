"""A toy drafter kind, "toy", as a newcomer would add one: its weights (`BigramHead`: the next token from the last
one alone), its drafter (`BigramDrafter`) with `build`, and its checkpoint reader (`read_bigram_head`, a head file).
Its learner is the drafter-LM family's (`DraftLearner`: the head looks like a one-layer LM to it). Registered by
`tests/test_drafter_registry.py` with one `register(TOY)` line."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import torch
from torch import nn

from specroll.integrations.model_source import ModelPaths, load_head_file
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.core.batch import RowBuffers
from specroll.rollout.drafters.draft_vocab import DraftVocab, VocabDraws
from specroll.rollout.drafters.protocol import DraftDraw, Drafter, Proposal
from specroll.rollout.drafters.registry import DrafterSpec
from specroll.rollout.models.rows import device_index
from specroll.rollout.models.runner import ModelRunner
from specroll.rollout.models.timing import ForwardTimes
from specroll.rollout.models.weights import cast_module, copy_into


class BigramBody(nn.Module):
    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(last_hidden_state=self.embed(input_ids))  # [B, L, H]


class BigramHead(nn.Module):
    """q(next | last token) = softmax(lm_head(embed(last))); shaped like a causal LM for the LM learner."""

    base_model_prefix = "body"

    def __init__(self, vocab_size: int, hidden: int = 16, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.body = BigramBody(vocab_size, hidden)
            self.lm_head = nn.Linear(hidden, vocab_size, bias=False)
        self.config = SimpleNamespace()

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


class BigramDrafter(Drafter):
    names = ("toy",)
    trainable = True
    wants_hidden = False

    def __init__(self, head: BigramHead, dtype: torch.dtype, device: torch.device, vocab_size: int):
        self.head = cast_module(head, device, dtype).eval().requires_grad_(False)
        self.device = device
        self.draws = VocabDraws(vocab_size)
        self.num_forwards = 0

    @torch.inference_mode()
    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        index = device_index(live)
        last = rows.tokens[index].gather(1, rows.seq_len[index, None] - 1)[:, 0]  # [n]
        drafts, qs = [], []
        for i in range(gamma):
            logits = self.draws.logits(self.head.body.embed(last), self.head.lm_head)  # [n, K]
            q, last = self.draws.draw(logits, params, draw, i)
            drafts.append(last)
            qs.append(q)
            self.num_forwards += 1
        return Proposal(torch.stack(drafts, 1), self.draws.proposal_q(torch.stack(qs, 1)))

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Nothing to roll back: it reads the last kept token."""

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """No state per row."""

    def move_row(self, src: int, dst: int) -> None:
        """No state per row."""

    def release(self) -> None:
        """No cache."""

    def allocate(self) -> None:
        """No cache."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.head, state_dict, "toy head")

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.draws.set(vocab, self.device)

    def draft_vocab(self) -> torch.Tensor | None:
        return self.draws.ids

    def cost_key(self) -> str:
        return f"toy:{self.head.lm_head.weight.shape}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        return ForwardTimes(list(batch_sizes), [1, 2], [[1e-6, 1e-6] for _ in batch_sizes])


def build(head: BigramHead | None, config: EngineConfig, target: ModelRunner) -> BigramDrafter:
    head = head if head is not None else BigramHead(target.vocab_size)
    return BigramDrafter(head, config.dtype, target.device, target.vocab_size)


def fresh_head(config: EngineConfig, target_config) -> BigramHead:
    return BigramHead(target_config.get_text_config().vocab_size)


def read_bigram_head(models: ModelPaths, engine: EngineConfig, target) -> BigramHead:
    """The toy kind's checkpoint reader: a fresh head with `models.head`'s weights (a head file) if given."""
    return load_head_file(fresh_head(engine, target.config), models.head)


TOY = DrafterSpec("toy", BigramDrafter, build, weights=BigramHead, fresh=fresh_head,
                  learner="specroll.online_drafter.lm.learner:DraftLearner", reader="toy_drafter:read_bigram_head",
                  draft_vocab=True, trainable=True, vllm_method=None)
