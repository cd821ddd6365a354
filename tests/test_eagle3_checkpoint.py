"""Public EAGLE-3 checkpoints: the speculators and SpecForge layouts load and draft exactly; misfits are refused.

The checkpoints are written here in exactly the public layouts (`eagle3_layouts`, after the files it cites), from a
head with random weights and an own LM head over half the vocabulary (`d2t` / `t2d`). Loaded, the head holds the
same tensors, drafts the same q as the head it was written from, and the engine's greedy output equals plain
decoding. A checkpoint that does not fit the target is refused with the field and both values.
"""

from __future__ import annotations

import json

import pytest
import torch
from eagle3_layouts import write_specforge, write_speculators
from safetensors.torch import load_file, save_file
from tiny_models import build_lm, make_prompts, tiny_lm
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from specroll.integrations.formats.eagle3 import load_eagle3_checkpoint
from specroll.integrations.model_source import ModelPaths, load_drafter
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.eagle3_head import Eagle3Head

PROMPTS = make_prompts(10, 1, 9)
GREEDY = SamplingParams(max_new_tokens=16, temperature=0)
LAYERS = (1, 2, 4)  # ≥ 1: SGLang's numbering cannot name the embeddings


def target():
    return tiny_lm("llama", "sdpa", layers=5)


def reference_head(qk_norm: bool = False, full_vocab: bool = False, **options) -> Eagle3Head:
    config = target().config
    ids = None if full_vocab else torch.arange(0, 64, 2)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        head = Eagle3Head(32, LAYERS, 4, 2, 8, 48, 10000.0, 1e-6, torch.arange(64) if full_vocab else ids,
                          ttt_steps=2, qk_norm=qk_norm, **options)
        for param in head.parameters():  # norms away from 1 too, so a misplaced tensor shows
            param.data.normal_(1.0 if param.dim() == 1 else 0.0, 0.3 if param.dim() == 1 else 0.15)
    assert config.hidden_size == 32
    return head


def drafts(head, steps=2):
    engine = SpecEngine(target(), head, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3))
    run = engine.generate_steps(PROMPTS[:4], SamplingParams(max_new_tokens=10, temperature=1.0, seed=3))
    for _ in range(steps):
        next(run)
    return engine.drafter.propose(slice(0, 4), engine.rows, 3, SamplingParams(max_new_tokens=1),
                                  lambda q, i, ids=None: (q.argmax(-1) if ids is None else ids[q.argmax(-1)]))


def plain():
    engine = SpecEngine(target(), None, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=0))
    return [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)]


OPTIONS = {"plain": {}, "norm_before_fc": dict(fusion_norm="joint"), "fc_norm": dict(fusion_norm="per_layer"),
           "norm_output": dict(norm_output=True), "norm_before_residual": dict(norm_before_residual=True)}
CASES = [("speculators", False, "plain"), ("speculators", True, "plain"), ("specforge", False, "plain"),
         ("specforge", False, "fc_norm"), *[("speculators", False, o) for o in OPTIONS if o != "plain"]]


@pytest.mark.parametrize(("layout", "qk_norm", "option"), CASES, ids=[f"{a}-{'qwen3' if b else 'llama'}-{c}"
                                                                      for a, b, c in CASES])
def test_public_checkpoint_loads_and_drafts_exactly(tmp_path, layout, qk_norm, option):
    head = reference_head(qk_norm, **OPTIONS[option])
    if layout == "speculators":
        folder = write_speculators(head, target(), tmp_path / "ckpt", "qwen3" if qk_norm else "llama")
    else:
        folder = write_specforge(head, target(), tmp_path / "ckpt")
    loaded = load_eagle3_checkpoint(folder, target())
    assert loaded.target_layers == LAYERS and torch.equal(loaded.draft_ids, head.draft_ids)
    assert loaded.ttt_steps == (2 if layout == "speculators" else 3)  # SpecForge's config does not say
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ours, theirs = drafts(head), drafts(loaded)
    assert torch.equal(ours.drafts, theirs.drafts) and torch.equal(ours.q.probs, theirs.q.probs)
    assert bool(torch.isin(theirs.drafts, head.draft_ids).all())  # only the checkpoint's d2t ids are drafted
    engine = SpecEngine(target(), loaded, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3))
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == plain()


def test_a_full_vocabulary_head_needs_no_vocabulary_maps(tmp_path):
    head = reference_head(full_vocab=True)
    folder = write_speculators(head, target(), tmp_path / "ckpt")
    assert not {"d2t", "t2d"} & set(load_file(folder / "model.safetensors"))
    loaded = load_eagle3_checkpoint(folder, target())
    assert torch.equal(loaded.draft_ids, torch.arange(64))
    assert torch.equal(drafts(loaded).q.probs, drafts(head).q.probs)


def _tokenizer(order):
    vocab = {f"t{i}": j for j, i in enumerate(order)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")))


MISFITS = [  # (how the target or the file differs, the message naming the field and both values)
    ("hidden", r"transformer_layer_config.hidden_size is 32 in the checkpoint, 48 in the target"),
    ("vocab", r"transformer_layer_config.vocab_size is 64 in the checkpoint, 80 in the target"),
    ("layers", r"eagle_aux_hidden_state_layer_ids = \[1, 2, 4\] does not fit the target: it has 3 decoder layers"),
    ("eos", r"transformer_layer_config.eos_token_id is 2 in the checkpoint, 7 in the target"),
    ("tokenizer", r"tokenizer differs from the target's: 2 tokens numbered differently, e.g. 't3': 3 in the "
                  r"checkpoint, 4 in the target"),
    ("t2d", r"t2d marks other target ids than d2t maps to"),
    ("two_layers", r"transformer_layer_config.num_hidden_layers=2 is not supported"),
    ("norm_output", r"norm_output=False is not supported"),
    ("specforge_layers", r"eagle_config.eagle_aux_hidden_state_layer_ids \(SGLang numbering, \+ 1 here\) = "
                         r"\[1, 2, 4\] does not fit the target: it has 3 decoder layers"),
    ("layout", r"not an EAGLE-3 checkpoint this loader knows: speculators_model_type='mtp'"),
    ("both_fusion_norms", r"norm_before_fc and fc_norm=True is not supported: at most one of them"),
]


@pytest.mark.parametrize(("misfit", "message"), MISFITS, ids=[m[0] for m in MISFITS])
def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_field(tmp_path, misfit, message):
    head, folder, tokenizer = reference_head(), tmp_path / "ckpt", None
    other = {"hidden": dict(hidden=48), "vocab": dict(vocab=80), "layers": dict(layers=3),
             "specforge_layers": dict(layers=3), "eos": dict(layers=5, eos_token_id=7)}.get(misfit)
    against = build_lm("llama", "sdpa", **{"layers": 5, **other}) if other else target()
    if misfit == "specforge_layers":
        write_specforge(head, target(), folder)
    elif misfit == "norm_output":  # SpecForge's LM head reads the output without the final norm
        write_specforge(head, target(), folder, norm_output=False)
    else:
        overrides = {"layout": dict(speculators_model_type="mtp"),
                     "both_fusion_norms": dict(norm_before_fc=True, fc_norm=True)}.get(misfit, {})
        write_speculators(head, target(), folder, **overrides)
    config = json.loads((folder / "config.json").read_text())
    if misfit == "two_layers":
        config["transformer_layer_config"]["num_hidden_layers"] = 2
        (folder / "config.json").write_text(json.dumps(config))
    if misfit == "t2d":
        tensors = load_file(folder / "model.safetensors")
        tensors["t2d"] = torch.roll(tensors["t2d"], 1)
        save_file(tensors, folder / "model.safetensors")
    if misfit == "tokenizer":
        _tokenizer(range(64)).save_pretrained(folder)
        tokenizer = _tokenizer([0, 1, 2, 4, 3, *range(5, 64)])
    with pytest.raises(ValueError, match=message):
        load_eagle3_checkpoint(folder, against, tokenizer)


def test_a_matching_tokenizer_passes(tmp_path):
    folder = write_speculators(reference_head(), target(), tmp_path / "ckpt")
    _tokenizer(range(64)).save_pretrained(folder)
    assert load_eagle3_checkpoint(folder, target(), _tokenizer(range(64))).target_layers == LAYERS


def test_models_head_loads_a_checkpoint_folder_for_eagle3(tmp_path):
    folder = write_speculators(reference_head(), target(), tmp_path / "ckpt")
    paths = ModelPaths(target=str(tmp_path), head=str(folder))  # no tokenizer there: none compared
    head = load_drafter(paths, EngineConfig(drafters=("eagle3",)), target())
    assert isinstance(head, Eagle3Head) and head.target_layers == LAYERS
    with pytest.raises(ValueError, match=r"engine.eagle3_layers=\(1, 3\) does not match the checkpoint"):
        load_drafter(paths, EngineConfig(drafters=("eagle3",), eagle3_layers=(1, 3)), target())
    fresh = load_drafter(ModelPaths(target=str(tmp_path)), EngineConfig(drafters=("eagle3",), eagle3_layers=(1, 3)),
                         target())
    assert fresh.target_layers == (1, 3) and fresh.lm_head is None
    path = tmp_path / "state.pt"
    torch.save(reference_head().state_dict(), path)
    with pytest.raises(ValueError, match="its own LM head, whose draft ids a state_dict does not carry"):
        load_drafter(ModelPaths(target=str(tmp_path), head=str(path)), EngineConfig(drafters=("eagle3",)), target())
    trained = {name: tensor + 1 for name, tensor in fresh.state_dict().items()}  # not what a fresh head holds
    torch.save(trained, path)  # a head on the target's LM head: a state_dict file over a fresh one
    loaded = load_drafter(ModelPaths(target=str(tmp_path), head=str(path)),
                          EngineConfig(drafters=("eagle3",), eagle3_layers=(1, 3)), target())
    assert torch.equal(loaded.fc.weight, trained["fc.weight"])
