"""Tiny models, a character tokenizer with a chat template and GRPO settings for the TRL tests.

Built in seconds from configs (no downloads); the policy is a 2-layer Llama, the drafter 1 layer.
"""

from __future__ import annotations

from datasets import Dataset
from tiny_models import build_lm
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig

CHARS = list("0123456789+=: abcdefghijklmnopqrstuvwxyz")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<s>' + m['role'] + ':' + m['content'] + '</s>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant:' }}{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>", *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_model(vocab_size: int, seed: int, hidden: int = 32, layers: int = 2) -> LlamaForCausalLM:
    return build_lm(attn="eager", vocab=vocab_size, hidden=hidden, layers=layers, seed=seed, logit_scale=1.0,
                    max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                    eos_token_id=2)


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=6,
        max_steps=2, learning_rate=5e-2, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
        save_strategy="no", seed=0, beta=0.0, temperature=1.0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def prompt_dataset() -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{a}+{a}="}] for a in range(8)]})


def length_reward(prompts, completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


