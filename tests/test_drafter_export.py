"""What specroll writes of a drafter loads back through `models:` as the same drafter, and in the layout the
speculators library (and so vLLM) reads.

Each head gets random weights (norms away from 1), is written by `integrations.drafter_export`, read back by
`model_source.load_drafter` (the `models:` section's loader), and must hold the same tensors, the same draft
vocabulary, and serve the same greedy tokens with the same accepted drafts. The speculators check builds the
library's own model class from the written config.json (`Eagle3DraftModel` / `DFlashDraftModel`, speculators 0.9)
and loads model.safetensors into it: no tensor unexpected or misshapen, none missing but those speculators fills
from the verifier. It runs where speculators is installed (`pip install --no-deps speculators`; its training-only
`hs_connectors` import is stubbed), and is skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import make_prompts, tiny_lm

from specroll.integrations.drafter_export import export_drafter
from specroll.integrations.formats.dflash import load_block_checkpoint
from specroll.integrations.model_source import ModelPaths, load_drafter
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.block_head import BlockHead
from specroll.rollout.drafters.draft_vocab import CARRIED_ATTR, carry
from specroll.rollout.drafters.eagle3_head import Eagle3Head
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads

PROMPTS = make_prompts(6, 2, 9)
GREEDY = SamplingParams(max_new_tokens=12, temperature=0)
SUBSET = torch.arange(0, 64, 2)  # a draft vocabulary of half the tiny vocabulary
# speculators fills these from the verifier (`_keys_to_ignore_on_load_missing`, `load_verifier_weights`)
VERIFIER_FILLED = {"verifier_lm_head.weight", "verifier_norm.weight", "embed_tokens.weight", "t2d", "d2t"}


def randomized(head: torch.nn.Module, seed: int = 5) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for param in head.parameters():
            param.data.normal_(1.0 if param.dim() == 1 else 0.0, 0.3 if param.dim() == 1 else 0.15)
    return head


def served(target, drafter, kind: str, **engine) -> tuple[list[list[int]], int]:
    """Greedy completions and the drafts accepted serving `drafter`."""
    config = EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=(kind,), **engine)
    spec = SpecEngine(target, drafter, config)
    tokens = [r.completion_ids for r in spec.generate(PROMPTS, GREEDY)]
    return tokens, spec.stats.accepted


def assert_same(original: torch.nn.Module, loaded: torch.nn.Module) -> None:
    ours, theirs = original.state_dict(), loaded.state_dict()
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def speculators_loads(folder, module: str, model: str) -> None:
    """The speculators library builds its model from our config.json and takes our tensors (see the module doc)."""
    if importlib.util.find_spec("speculators") is None:
        pytest.skip("speculators is not installed (pip install --no-deps speculators)")
    if "hs_connectors" not in sys.modules and importlib.util.find_spec("hs_connectors") is None:  # training only
        stub = types.ModuleType("hs_connectors")
        stub.FileTransfer = stub.HiddenStatesTransfer = object
        sys.modules["hs_connectors"] = stub
    classes = importlib.import_module(f"speculators.models.{module}")
    config_class = next(getattr(classes, n) for n in dir(classes) if n.endswith("SpeculatorConfig"))
    config = config_class(**json.loads((folder / "config.json").read_text()))
    draft = getattr(classes, model)(config)
    missing, unexpected = draft.load_state_dict(load_file(folder / "model.safetensors"), strict=False)
    assert not unexpected and set(missing) <= VERIFIER_FILLED, (missing, unexpected)


@pytest.mark.parametrize("layout", ["own_lm_head", "target_lm_head", "carried_vocab"])
def test_eagle3_head_round_trips_through_the_speculators_layout(tmp_path, layout):
    target = tiny_lm("qwen3", "sdpa", layers=5)
    head = randomized(Eagle3Head(32, (1, 2, 4), 4, 2, 8, 48, 10000.0, 1e-6,
                                 SUBSET if layout == "own_lm_head" else None, ttt_steps=2, qk_norm=True))
    if layout == "carried_vocab":
        carry(head, SUBSET)
    engine = {"draft_vocab": SUBSET.numel()} if layout == "carried_vocab" else {}
    exported = export_drafter(head, "eagle3", target, tmp_path / "drafter")
    config = json.loads((exported.path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    tensors = load_file(exported.path / "model.safetensors")
    if layout == "target_lm_head":
        assert config["draft_vocab_size"] == 64 and not {"d2t", "t2d"} & set(tensors)
    else:
        assert config["draft_vocab_size"] == 32 and tensors["d2t"].dtype == torch.int64
        assert tensors["t2d"].dtype == torch.bool and tensors["lm_head.weight"].shape == (32, 32)
    paths = ModelPaths(str(tmp_path), head=str(exported.path))
    loaded = load_drafter(paths, EngineConfig(drafters=("eagle3",)), target)
    assert torch.equal(loaded.draft_ids, SUBSET if layout != "target_lm_head" else torch.arange(64))
    if layout == "own_lm_head":
        assert_same(head, loaded)
    assert served(target, loaded, "eagle3") == served(target, head, "eagle3", **engine)
    speculators_loads(exported.path, "eagle3", "Eagle3DraftModel")


@pytest.mark.parametrize("carried", [False, True], ids=["whole_vocab", "draft_vocab"])
def test_block_head_round_trips_through_both_dflash_layouts(tmp_path, carried):
    target = tiny_lm("qwen3", "sdpa", layers=5)
    head = carry(randomized(BlockHead.for_target(target.config, block_size=4, num_layers=2)),
                 SUBSET if carried else None)
    engine = {"block_size": 4, **({"draft_vocab": SUBSET.numel()} if carried else {})}
    exported = export_drafter(head, "block", target, tmp_path / "drafter")
    assert set(exported.layouts) == {"speculators", "zlab"}
    config = json.loads((exported.path / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == [i + 1 for i in head.target_layers]
    expected = served(target, head, "block", **engine)
    for folder in exported.layouts.values():
        loaded = load_block_checkpoint(folder, target)
        assert_same(head, loaded)  # the trained mask vector too: speculators' embed_tokens row, z-lab's extra tensor
        ids = getattr(loaded, CARRIED_ATTR, None)
        if folder == exported.path:
            assert torch.equal(ids, SUBSET) if carried else ids is None
            assert served(target, loaded, "block", **engine) == expected
    speculators_loads(exported.path, "dflash", "DFlashDraftModel")


def test_a_speculators_dflash_checkpoint_is_read_as_zlab_s(tmp_path):
    """The reader takes the speculators library's own `dflash` layout, not only z-lab's (the same head both ways)."""
    target = tiny_lm("qwen3", "sdpa", layers=5)
    head = randomized(BlockHead.for_target(target.config, block_size=4))
    head.mask_embedding.data.copy_(target.get_input_embeddings().weight[7])  # a checkpoint's: a token's embedding
    exported = export_drafter(head, "block", target, tmp_path / "drafter")
    zlab = json.loads((exported.layouts["zlab"] / "config.json").read_text())
    assert zlab["dflash_config"]["mask_token_id"] == 7
    assert "mask_embedding" not in load_file(exported.layouts["zlab"] / "model.safetensors")
    from_speculators = load_block_checkpoint(exported.path, target)
    assert_same(load_block_checkpoint(exported.layouts["zlab"], target), from_speculators)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_specroll_s_own_heads_round_trip_as_state_dict_files(tmp_path, kind):
    target = tiny_lm("llama", "sdpa", layers=2)
    text = target.config
    head = carry(randomized(EagleHead.for_target(text) if kind == "eagle" else MedusaHeads(text.hidden_size, 2)),
                 SUBSET)
    engine = EngineConfig(drafters=(kind,), medusa_heads=2)
    exported = export_drafter(head, kind, target, tmp_path / "drafter", engine=engine)
    assert exported.path.name == f"{kind}.pt" and exported.engine["draft_vocab"] == SUBSET.numel()
    loaded = load_drafter(ModelPaths(str(tmp_path), head=str(exported.path)), engine, target)
    assert_same(head, loaded)
    assert torch.equal(getattr(loaded, CARRIED_ATTR), SUBSET)
