"""Rollout workers and the local backend find the tokenizers, so padded vocabularies of different sizes work.

A target and a drafter over the same tokenizer whose embedding tables are padded to different sizes
(as Qwen2.5-7B and 0.5B are) can only be told compatible by comparing the vocabularies; without the
tokenizers the engine refuses the pair.
"""

from __future__ import annotations

import pytest
from tiny_models import build_lm
from transformers import LlamaForCausalLM

from specroll.demo.tokenizer import build_tokenizer
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.model_source import ModelPaths, load_tokenizer, tokenizer_pair
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine


def padded_llama(vocab_rows: int, seed: int) -> LlamaForCausalLM:
    return build_lm(vocab=vocab_rows, hidden=32, layers=1, seed=seed, logit_scale=1.0, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("padded")
    tokenizer = build_tokenizer()
    for name, rows, seed in (("target", len(tokenizer) + 25, 0), ("drafter", len(tokenizer) + 5, 1)):
        padded_llama(rows, seed).save_pretrained(root / name)
    tokenizer.save_pretrained(root / "tokenizer")
    return root


def test_padded_pair_needs_the_tokenizers(folders):
    target = LlamaForCausalLM.from_pretrained(folders / "target")
    drafter = LlamaForCausalLM.from_pretrained(folders / "drafter")
    config = EngineConfig(max_batch_size=2, max_seq_len=32, gamma=2)
    with pytest.raises(ValueError, match="vocab size"):
        SpecEngine(target, drafter, config)

    bare = ModelPaths(str(folders / "target"), str(folders / "drafter"))
    assert tokenizer_pair(bare) == (None, None)  # no tokenizer files in the model folders
    paths = ModelPaths(str(folders / "target"), str(folders / "drafter"), str(folders / "tokenizer"),
                       str(folders / "tokenizer"))
    pair = tokenizer_pair(paths)
    assert all(tok is not None for tok in pair)
    backend = LocalBackend.from_models(target, drafter, config, None, *pair)
    rollouts = backend.generate([[1, 5, 6]], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0), n=2)
    assert [len(r.completion_ids) for r in rollouts] == [4, 4]


def test_load_tokenizer_without_files_is_none(tmp_path):
    assert load_tokenizer(str(tmp_path)) is None
    assert load_tokenizer(None) is None


def test_a_named_tokenizer_folder_without_one_is_refused_not_ignored(tmp_path):
    """`models.tokenizer` named but holding no tokenizer: one `ConfigError` naming it (the run used to go on
    without a tokenizer); unset, a target folder without one is still allowed (the engine compares sizes)."""
    from specroll.integrations.yaml_config import ConfigError
    from specroll.jobs.backends import resolve_models
    from specroll.jobs.train_config import ModelsConfig, TrainConfig

    (tmp_path / "empty").mkdir()
    named = ModelsConfig(source="pretrained", target=str(tmp_path / "target"), tokenizer=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"models.tokenizer=.*empty.* is invalid: no tokenizer there"):
        resolve_models(TrainConfig(models=named))
    unset = resolve_models(TrainConfig(models=ModelsConfig(source="pretrained", target=str(tmp_path / "target"))))
    assert unset.tokenizer is None
