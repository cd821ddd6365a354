"""Bad input fails early with a ValueError naming the field; edge inputs that are valid work.

"Before any model call" is checked with a forward pre-hook counting calls on target and drafter.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import VOCAB, build_lm, tiny_lm
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

MAX_SEQ_LEN = 16


@pytest.fixture
def counted_engine():
    """An engine whose target and drafter count their forward calls in `engine.model_calls`."""
    target, drafter = build_lm("llama", "sdpa"), build_lm("llama", "sdpa", hidden=16, layers=1, seed=1)
    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=2, max_seq_len=MAX_SEQ_LEN, gamma=2))
    engine.model_calls = []
    for model in (target, drafter):  # the embedding runs in HF's forward and in the lean one alike
        model.get_input_embeddings().register_forward_pre_hook(lambda module, args: engine.model_calls.append(module))
    return engine


@pytest.mark.parametrize(
    ("prompts", "n", "field"),
    [
        ([[1, 2], []], 1, r"prompts\[1\]"),  # empty prompt
        ([[1, 2], [3, -1]], 1, r"prompts\[1\]"),  # id < 0
        ([[1, 2], [3, VOCAB]], 1, r"prompts\[1\]"),  # id >= vocab
        ([[1, 2], [3] * (MAX_SEQ_LEN - 3)], 1, "max_seq_len"),  # prompt + max_new_tokens > max_seq_len
        ([[1, 2]], 0, "n="),
        ([[1, 2]], -2, "n="),
    ],
    ids=["empty-prompt", "negative-id", "id-past-vocab", "too-long", "n-zero", "n-negative"],
)
def test_bad_generate_input_raises_before_any_model_call(counted_engine, prompts, n, field):
    with pytest.raises(ValueError, match=field):
        counted_engine.generate(prompts, SamplingParams(max_new_tokens=4), n=n)
    assert counted_engine.model_calls == []


def test_call_counter_sees_model_calls(counted_engine):
    # Guards the test above: the hooks do count when generate reaches the models.
    counted_engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert len(counted_engine.model_calls) > 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
    ids=["max-new-zero", "temp-negative", "temp-inf", "temp-nan", "top-p-zero", "top-p-above-one", "top-k-negative"],
)
def test_bad_sampling_params_raise_naming_the_field(kwargs, field):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_negative_gamma_raises_naming_the_field():
    with pytest.raises(ValueError, match="gamma"):
        EngineConfig(gamma=-1)


def test_prompt_of_max_seq_len_minus_one_with_one_new_token_works():
    target = tiny_lm("llama", "sdpa")
    engine = SpecEngine(target, target, EngineConfig(max_batch_size=2, max_seq_len=MAX_SEQ_LEN, gamma=8))
    prompt = torch.randint(VOCAB, (MAX_SEQ_LEN - 1,), generator=torch.Generator().manual_seed(0)).tolist()
    [rollout] = engine.generate([prompt], SamplingParams(max_new_tokens=1, temperature=0))
    with torch.no_grad():
        expected = int(target(torch.tensor([prompt])).logits[0, -1].argmax())
    assert rollout.completion_ids == [expected]
    assert rollout.finish_reason == "length"


def word_level_tokenizer(tokens: list[str]) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=tokens[0])))


TOKENS = ["<unk>"] + [f"w{i}" for i in range(59)]  # 60 tokens; the models have 64 or more rows


def test_drafter_with_permuted_vocabulary_is_refused():
    swapped = TOKENS.copy()
    swapped[5], swapped[6] = swapped[6], swapped[5]  # same tokens, same size, two ids exchanged
    with pytest.raises(ValueError, match="vocabulary"):
        SpecEngine(tiny_lm("llama", "sdpa"), build_lm("llama", "sdpa", hidden=16, layers=1),
                   EngineConfig(max_batch_size=1, max_seq_len=MAX_SEQ_LEN),
                   target_tokenizer=word_level_tokenizer(TOKENS), drafter_tokenizer=word_level_tokenizer(swapped))


def test_drafter_missing_target_tokens_is_refused():
    with pytest.raises(ValueError, match="vocabulary"):
        SpecEngine(tiny_lm("llama", "sdpa"), build_lm("llama", "sdpa", hidden=16, layers=1),
                   EngineConfig(max_batch_size=1, max_seq_len=MAX_SEQ_LEN),
                   target_tokenizer=word_level_tokenizer(TOKENS), drafter_tokenizer=word_level_tokenizer(TOKENS[:50]))


@pytest.mark.parametrize("drafter_rows", [VOCAB + 8, len(TOKENS)], ids=["more-rows", "fewer-rows"])
def test_drafter_with_same_tokenizer_and_other_embedding_rows_is_accepted(drafter_rows):
    # Embedding rows past the tokenizer's 60 tokens (the target has 64) are padding either way.
    target = tiny_lm("llama", "sdpa")
    drafter = build_lm("llama", "sdpa", vocab=drafter_rows, hidden=16, layers=1, seed=2)
    tokenizer = word_level_tokenizer(TOKENS)
    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=2, max_seq_len=MAX_SEQ_LEN, gamma=2),
                        target_tokenizer=tokenizer, drafter_tokenizer=word_level_tokenizer(TOKENS))
    plain = SpecEngine(target, None, EngineConfig(max_batch_size=2, max_seq_len=MAX_SEQ_LEN, gamma=0))
    params = SamplingParams(max_new_tokens=6, temperature=0)
    prompts = [[1, 2, 3], [4]]
    assert [r.completion_ids for r in engine.generate(prompts, params)] == [
        r.completion_ids for r in plain.generate(prompts, params)
    ]


def test_drafter_with_fewer_rows_survives_target_emitting_padding_ids():
    # Regression: a target id past the drafter's embedding rows crashed the drafter's forward.
    tokenizer = word_level_tokenizer(TOKENS)
    engine = SpecEngine(tiny_lm("llama", "sdpa"), build_lm("llama", "sdpa", vocab=len(TOKENS), hidden=16, layers=1),
                        EngineConfig(max_batch_size=8, max_seq_len=40, gamma=2),
                        target_tokenizer=tokenizer, drafter_tokenizer=word_level_tokenizer(TOKENS))
    # T = 20 makes the target's 4 padding ids (60..63) likely enough to be emitted.
    rollouts = engine.generate([[1, 2, 3]] * 8, SamplingParams(max_new_tokens=30, temperature=20.0, seed=0))
    assert all(len(r.completion_ids) == 30 for r in rollouts)
    assert any(t >= len(TOKENS) for r in rollouts for t in r.completion_ids)


def test_drafter_of_other_vocab_size_without_tokenizers_is_refused():
    with pytest.raises(ValueError, match="vocab size"):
        SpecEngine(tiny_lm("llama", "sdpa"), build_lm("llama", "sdpa", vocab=VOCAB + 8, hidden=16, layers=1),
                   EngineConfig(max_batch_size=1, max_seq_len=MAX_SEQ_LEN))
