"""README's public-API snippets run as written, with tiny models standing in for the reader's own.

The snippets are read from README.md itself (its ```python blocks), so a README edit that breaks an
API call fails here. The stand-ins: a 2-layer Llama policy and a 1-layer drafter over a character
tokenizer, whose final norm is zeroed so every next token is uniform (the end token comes about
every 44 tokens: completions stay short under README's 512-token budget), one prompt, a length reward.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset
from trl_tiny import length_reward, tiny_model, tiny_tokenizer

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_snippet(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


def uniform_lm(vocab: int, seed: int, **kwargs):
    model = tiny_model(vocab, seed, **kwargs)
    with torch.no_grad():
        model.model.norm.weight.zero_()  # every logit 0: a uniform next token, the end token included
    return model


def test_the_grpo_trainer_snippet_trains_with_the_hook(tmp_path, monkeypatch):
    import trl

    monkeypatch.chdir(tmp_path)  # the snippet writes GRPOConfig(output_dir="out")
    if not torch.cuda.is_available():  # TRL's defaults (bf16) refuse a CPU; the snippet is as written otherwise
        config_cls = trl.GRPOConfig
        monkeypatch.setattr(trl, "GRPOConfig",
                            lambda **kw: config_cls(use_cpu=True, bf16=False, report_to="none", **kw))
    tokenizer = tiny_tokenizer()
    target = uniform_lm(len(tokenizer), seed=0)
    namespace = dict(target=target, drafter=uniform_lm(len(tokenizer), seed=1, hidden=16, layers=1),
                     policy=copy.deepcopy(target), tokenizer=tokenizer, my_reward=length_reward,
                     dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "12+34="}]]}))
    exec(readme_snippet("from trl import GRPOConfig, GRPOTrainer"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step >= 1
    assert namespace["backend"].engine.policy_version == trainer.state.global_step  # synced at train() end
    assert any("rollout/tokens" in e for e in trainer.state.log_history)


def test_the_engine_snippet_generates(tmp_path):
    tokenizer = tiny_tokenizer()
    namespace = dict(target=uniform_lm(len(tokenizer), seed=0), eos=tokenizer.eos_token_id,
                     drafter=uniform_lm(len(tokenizer), seed=1, hidden=16, layers=1),
                     prompt_ids=[tokenizer("12+34=")["input_ids"], tokenizer("7+8=")["input_ids"]])
    snippet = readme_snippet("from specroll.rollout import SpecEngine")
    *statements, last = snippet.strip().splitlines()
    exec("\n".join(statements), namespace)
    completion_ids, logprobs, num_accepted, acceptance = eval(last, namespace)
    rollouts = namespace["rollouts"]
    assert len(rollouts) == 2 * 8 and len(completion_ids) == len(logprobs) >= 1
    assert 0 <= num_accepted <= len(completion_ids) and 0 <= acceptance <= 1
