"""The subword demo world: its byte-level BPE, the word-problem task, the reward on it, the recipe and the
sampled-softmax loss its build trains with."""

import argparse
import random
import statistics
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from specroll.demo import cli_build, story
from specroll.demo.bpe import VOCAB_SIZE, build_bpe_tokenizer, train_bpe
from specroll.demo.build import llama_config
from specroll.demo.pretrain import Example, batch_loss, sparse_batch_loss
from specroll.demo.recipe import RECIPE_NAMES, DemoRecipe, ModelShape
from specroll.demo.reward import RewardConfig, make_reward, score
from specroll.demo.task import Style
from specroll.demo.tokenizer import build_tokenizer, encode_prompt
from specroll.jobs.task_source import load_task
from specroll.jobs.train_config import TaskSettings, load_train_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PROBLEM = story.StoryProblem(457, 68, "Brontal", "Quoa", "skeamixes")
SMALL = {"vocab_size": 1024, "num_sentences": 3_000, "task_examples": 200}  # trains in about a second


@pytest.fixture(scope="module")
def tokenizer():
    """A 1,024-entry BPE trained like the recipe's (about a second): the template, round trips, parsing."""
    return train_bpe(**SMALL)


@pytest.fixture(scope="module")
def full_tokenizer():
    """The recipe's 32,768-entry tokenizer (trained once per process: ~10 s on 2 quiet cores)."""
    return build_bpe_tokenizer()


@pytest.mark.slow
def test_bpe_has_32k_entries_and_the_demo_special_tokens(full_tokenizer):
    tokenizer = full_tokenizer
    assert len(tokenizer) == VOCAB_SIZE >= 32_000
    specials = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    assert None not in specials and len(specials) == 4
    for role in ("<|system|>", "<|user|>", "<|assistant|>"):
        assert len(tokenizer(role, add_special_tokens=False)["input_ids"]) == 1


def test_text_round_trips_and_digits_are_single_tokens(tokenizer):
    text = story.solution(PROBLEM, Style.VERBOSE) + "\n émoji ✓ 2+2"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2  # real merges: whole words, not bytes
    digits = tokenizer("1234567", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in digits] == list("1234567")


def test_chat_template_renders_a_generation_prompt(tokenizer):
    messages = story.to_messages(PROBLEM)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == f"<s><|user|>{PROBLEM.text}<|assistant|>"
    ids = encode_prompt(tokenizer, messages)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|assistant|>")


def test_saved_tokenizer_loads_back_identical(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = PROBLEM.text + story.solution(PROBLEM, Style.COMPACT)
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.chat_template == tokenizer.chat_template and len(loaded) == len(tokenizer)


def test_training_is_deterministic_and_seeded():
    first, again, other = train_bpe(seed=0, **SMALL), train_bpe(seed=0, **SMALL), train_bpe(seed=1, **SMALL)
    assert len(first) == SMALL["vocab_size"]
    assert first.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()
    assert first.backend_tokenizer.to_str() != other.backend_tokenizer.to_str()


def test_a_corpus_too_small_for_the_vocabulary_fails_naming_it():
    with pytest.raises(ValueError, match="vocab_size=4096"):
        train_bpe(vocab_size=4096, num_sentences=50, task_examples=10)


@pytest.mark.slow
def test_task_completions_are_long_tailed_over_a_small_part_of_the_vocabulary(full_tokenizer):
    tokenizer = full_tokenizer
    problems = story.make_problems(1000, seed=5, max_digits=10)
    lengths, used = [], set()
    for problem in problems:
        ids = tokenizer(story.solution(problem, Style.VERBOSE), add_special_tokens=False)["input_ids"]
        lengths.append(len(ids))
        used.update(ids)
    lengths.sort()
    assert 60 <= statistics.mean(lengths) <= 200
    assert lengths[int(0.99 * len(lengths))] >= 300
    assert 500 <= len(used) <= len(tokenizer) // 4


def test_both_styles_parse_and_compact_is_much_shorter():
    verbose, compact = story.solution(PROBLEM, Style.VERBOSE), story.solution(PROBLEM, Style.COMPACT)
    assert story.style_of(verbose) is Style.VERBOSE and story.style_of(compact) is Style.COMPACT
    assert verbose.endswith("Answer: 525") and compact.endswith("Answer: 525")
    assert len(compact) < len(verbose) / 3
    assert story.style_of(verbose.replace("Answer: 525", "Answer: 5x")) is None


def test_the_problem_reads_back_from_messages_and_templated_text(tokenizer):
    assert story.parse_problem(story.to_messages(PROBLEM)) == PROBLEM
    templated = tokenizer.apply_chat_template(story.to_messages(PROBLEM), add_generation_prompt=True, tokenize=False)
    assert story.parse_problem(templated) == PROBLEM
    with pytest.raises(ValueError, match="no word problem"):
        story.parse_problem("457+68")


def test_problems_are_reproducible_and_names_repeat_like_a_zipf_law():
    problems = story.make_problems(2000, seed=3)
    assert problems == story.make_problems(2000, seed=3)
    counts = sorted((sum(p.name == n for p in problems) for n in {p.name for p in problems}), reverse=True)
    assert counts[0] >= 20 and counts.count(1) >= 100  # a head of frequent names and a long tail of rare ones


def test_reward_pays_compact_over_verbose_and_zero_for_wrong_work():
    config = RewardConfig(brevity=1.0, format_bonus=0.5)
    verbose, compact = story.solution(PROBLEM, Style.VERBOSE), story.solution(PROBLEM, Style.COMPACT)
    assert score(PROBLEM, compact, config, world="bpe") == pytest.approx(1.5)
    assert score(PROBLEM, verbose, config, world="bpe") == pytest.approx(len(compact) / len(verbose))
    assert score(PROBLEM, verbose.replace("525", "526"), config, world="bpe") == 0.0
    assert score(PROBLEM, compact.replace("525", "526"), config, world="bpe") == 0.5  # the format bonus alone
    assert score(PROBLEM, "", config, world="bpe") == 0.0


def test_reward_function_reads_the_problem_from_conversational_prompts():
    reward = make_reward(RewardConfig(brevity=0.0), world="bpe")
    prompts = [story.to_messages(PROBLEM)] * 2
    completions = [[{"role": "assistant", "content": story.solution(PROBLEM, style)}] for style in Style]
    assert reward(prompts=prompts, completions=completions) == [1.0, 1.0]
    with pytest.raises(ValueError, match="world='words'"):
        make_reward(world="words")


def test_chars_recipes_keep_their_dicts_and_bpe_recipes_differ():
    for recipe in (DemoRecipe(), DemoRecipe.tiny()):
        assert not {"world", "vocab_size", "softmax_negatives", "distill_top_k"} & set(recipe.to_dict())
        assert DemoRecipe.from_dict(recipe.to_dict()) == recipe
    bpe = DemoRecipe.bpe()
    assert bpe.to_dict()["world"] == "bpe" and bpe.vocab_size >= 32_000
    assert DemoRecipe.from_dict(bpe.to_dict()) == bpe
    assert len({DemoRecipe.named(name).hash for name in RECIPE_NAMES}) == len(RECIPE_NAMES)
    assert DemoRecipe.named("full") == DemoRecipe() and DemoRecipe.named("bpe_tiny") == DemoRecipe.bpe_tiny()


@pytest.mark.parametrize(("fields", "match"), [
    ({"world": "words"}, "world='words'"),
    ({"vocab_size": 1000}, "vocab_size=1000 is invalid for world='chars'"),
    ({"world": "bpe"}, "vocab_size=None is invalid for world='bpe'"),
    ({"softmax_negatives": -1}, "softmax_negatives=-1"),
    ({"distill_top_k": 0}, "distill_top_k=0"),
])
def test_bad_world_fields_fail_naming_them(fields, match):
    with pytest.raises(ValueError, match=match):
        DemoRecipe(**fields)
    with pytest.raises(ValueError, match="recipe='huge'"):
        DemoRecipe.named("huge")


def _tiny_batch(vocab: int, seed: int) -> tuple[LlamaForCausalLM, list[Example]]:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(ModelShape(32, 1, 2, 64), build_tokenizer(), 64)).eval()
    rng = random.Random(seed)
    batch = [Example([rng.randrange(7, vocab) for _ in range(n)], 3) for n in (9, 12, 6)]
    return model, batch


def test_sparse_loss_with_no_negatives_is_the_full_cross_entropy():
    model, batch = _tiny_batch(len(build_tokenizer()), seed=0)
    with torch.no_grad():
        torch.testing.assert_close(sparse_batch_loss(model, batch, 0, negatives=0), batch_loss(model, batch, 0))


def test_sampled_softmax_that_draws_every_id_is_the_full_cross_entropy():
    model, batch = _tiny_batch(len(build_tokenizer()), seed=1)
    torch.manual_seed(0)
    with torch.no_grad():  # 20,000 draws over ~100 ids: every id drawn (misses one with p < 1e-80)
        sampled = sparse_batch_loss(model, batch, 0, negatives=20_000)
        torch.testing.assert_close(sampled, batch_loss(model, batch, 0))


def test_sparse_soft_targets_match_dense_ones():
    model, batch = _tiny_batch(len(build_tokenizer()), seed=2)
    vocab = model.config.vocab_size
    dense, sparse = [], []
    for ex in batch:
        probs = torch.rand(len(ex.ids) - ex.prompt_len, 4).softmax(-1)  # [T, k]
        ids = torch.stack([torch.randperm(vocab)[:4] for _ in range(len(probs))])  # [T, k]
        dense.append(Example(ex.ids, ex.prompt_len, torch.zeros(len(probs), vocab).scatter_(1, ids, probs)))
        sparse.append(Example(ex.ids, ex.prompt_len, probs, ids))
    with torch.no_grad():
        torch.testing.assert_close(sparse_batch_loss(model, sparse, 0, negatives=0), batch_loss(model, dense, 0))


def test_the_main_job_config_selects_the_bpe_recipe_and_task():
    config = load_train_config(CONFIGS / "demo.yaml")
    assert config.models.recipe == "bpe"
    task = load_task(TaskSettings(), max_digits=4, world="bpe")
    prompts = task.prompts(3, 0)
    problems = [story.parse_problem(p) for p in prompts]
    completions = [story.solution(p, Style.COMPACT) for p in problems]
    assert task.reward_funcs(prompts=prompts, completions=completions) == [pytest.approx(2.0)] * 3


def test_cli_builds_a_named_recipe(monkeypatch, tmp_path):
    class Stop(Exception):
        pass

    built = []

    def fake_build(recipe, *args, **kwargs):
        built.append(recipe)
        raise Stop

    monkeypatch.setattr("specroll.demo.model_cache.build_demo_models", fake_build)
    parser = argparse.ArgumentParser()
    cli_build.add_arguments(parser)
    with pytest.raises(ValueError, match="--tiny with --recipe=bpe"):
        cli_build.run(parser.parse_args(["--tiny", "--recipe", "bpe"]))
    with pytest.raises(Stop):
        cli_build.run(parser.parse_args(["--recipe", "bpe", "--cache-dir", str(tmp_path)]))
    assert built == [DemoRecipe.bpe()]
