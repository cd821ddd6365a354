"""The first version of the demo target's feature heads (EAGLE-style, Medusa), trained offline from its own samples.

A fresh head drafts nothing useful, so before it serves it gets a first version: the target samples
completions of task prompts (T = 1, plain decoding, the hidden states and top-k p recorded exactly as
the online path records them: `RolloutSignals.hidden`), and `online_drafter.offline.train_offline` —
`specroll distill`'s recipe — trains each head on them for a time budget, gated on held-out groups like
every later version: two phases, at `lr` then at a fifth of it. The
prompts are drawn with their own seed (the benchmarks' prompts are not trained on). The result is cached
next to the demo models, under `<cache>/heads-<demo dir name>-v2/{eagle,medusa}.pt` with the samples and
a JSON report; `load_or_train_heads` trains only the heads asked for that the cache lacks.

Sizes, measured on the 2-core CPU: 768 prompts x 8 samples are 6144 sequences, 183k completion positions
(~270 MB of float16 hidden states), sampled in ~6 min. With the 96 prompts of the first version (23k
positions) the full-width EAGLE head overfit (training loss 0.04, 0.840 held out); on 8x the samples a
head with a 512-wide MLP (2.36M parameters, a quarter of the target's 2048) takes 2.2x the steps per
second of the full-width one (4.72M) and scored higher at equal time (0.903 vs 0.893 after 600 s), so
the demo's EAGLE head is the narrow one (it also drafts cheaper).

    python -m specroll.demo.heads          # train (or load) and print the held-out report
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specroll.online_drafter.heads.data import FeatureSequence, from_rollout
from specroll.online_drafter.offline import OfflineSchedule, train_offline
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads

TRAIN_PROMPT_SEED = 9001  # not the benchmarks' prompt seed (0)
MEDUSA_HEADS = 4
HEADS_VERSION = 2  # in the cache folder's name: bump when what is trained for the same demo models changes


@dataclass
class HeadTrainingSettings:
    prompts: int = 768
    samples: int = 8
    max_new_tokens: int = 128
    eagle_intermediate_size: int = 512
    eagle_budget_s: float = 900.0
    medusa_budget_s: float = 240.0
    round_s: float = 100.0  # a gate (held-out scoring, publish-if-better) every round_s of training
    lr: float = 1e-3
    final_lr: float = 2e-4  # the second phase's, for its last third of the budget

    def budget_s(self, name: str) -> float:
        return self.eagle_budget_s if name == "eagle" else self.medusa_budget_s

    def schedule(self, name: str) -> OfflineSchedule:
        """The offline schedule of head `name` ("eagle" or "medusa")."""
        return OfflineSchedule(budget_s=self.budget_s(name), round_s=self.round_s, lr=self.lr, final_lr=self.final_lr)


def sample_features(target: PreTrainedModel, prompts: list[list[int]], samples: int, max_new_tokens: int,
                    stop_token_ids: tuple[int, ...]) -> list[FeatureSequence]:
    """The target's own samples with its hidden states and top-k p, recorded by the engine (plain decoding)."""
    max_seq = max(map(len, prompts)) + max_new_tokens + 1
    config = EngineConfig(max_batch_size=32, max_seq_len=max_seq, gamma=0, drafters=("medusa",), record_signals=True)
    engine = SpecEngine(target, None, config)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=stop_token_ids,
                            seed=TRAIN_PROMPT_SEED)
    rollouts = engine.generate(prompts, params, n=samples)
    return [from_rollout(r) for r in rollouts if r.completion_ids]


def training_prompts(tokenizer, count: int) -> list[list[int]]:
    """The demo task's prompts the heads train on (their own seed: not the benchmarks' prompts)."""
    from specroll.demo.task import make_prompts
    from specroll.demo.tokenizer import encode_prompt

    return [list(map(int, encode_prompt(tokenizer, m))) for m in make_prompts(count, seed=TRAIN_PROMPT_SEED)]


def heads_dir(models_dir: Path) -> Path:
    return models_dir.parent / f"heads-{models_dir.name}-v{HEADS_VERSION}"


def load_or_train_heads(target: PreTrainedModel, prompts: list[list[int]], stop_token_ids: tuple[int, ...],
                        models_dir: Path, settings: HeadTrainingSettings | None = None,
                        names: tuple[str, ...] = ("eagle", "medusa")) -> dict[str, torch.nn.Module]:
    """{name: head} for `target` ("eagle": EagleHead, "medusa": MedusaHeads), from the cache or trained now."""
    settings = settings or HeadTrainingSettings()
    folder = heads_dir(models_dir)
    fresh = {"eagle": lambda: EagleHead.for_target(target.config, intermediate_size=settings.eagle_intermediate_size),
             "medusa": lambda: MedusaHeads(target.config.get_text_config().hidden_size, MEDUSA_HEADS)}
    unknown = [name for name in names if name not in fresh]
    if unknown:
        raise ValueError(f"heads {unknown} are unknown: 'eagle' or 'medusa'")
    heads = {name: fresh[name]() for name in names}
    missing = [name for name in heads if not (folder / f"{name}.pt").is_file()]
    if missing:
        sequences = _samples(target, prompts, stop_token_ids, folder, settings)
        report_path = folder / "report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        report.update({"settings": asdict(settings), "sequences": len(sequences)})
        positions = sum(s.num_positions for s in sequences)
        for name in missing:
            trained = train_offline(heads[name], target, sequences, settings.schedule(name), positions,
                                    desc=f"training the demo's {name} head")
            report[name] = trained.rounds
            torch.save(heads[name].state_dict(), folder / f"{name}.pt")
        report_path.write_text(json.dumps(report, indent=1))
    for name, head in heads.items():
        head.load_state_dict(torch.load(folder / f"{name}.pt", weights_only=True))
    return heads


def _samples(target: PreTrainedModel, prompts: list[list[int]], stop_token_ids: tuple[int, ...], folder: Path,
             settings: HeadTrainingSettings) -> list[FeatureSequence]:
    """The training samples, cached with the heads (a head retrained later trains on the same ones)."""
    path = folder / "samples.pt"
    if path.is_file():
        return [FeatureSequence(**fields) for fields in torch.load(path, weights_only=True)]
    started = time.perf_counter()
    sequences = sample_features(target, prompts, settings.samples, settings.max_new_tokens, stop_token_ids)
    print(f"sampled {len(sequences)} sequences ({sum(s.num_positions for s in sequences)} completion positions) "
          f"in {time.perf_counter() - started:.0f}s", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save([asdict(s) for s in sequences], path)
    return sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--retrain", default="", help="comma-separated heads to train again (eagle, medusa)")
    parser.add_argument("--eagle-budget-s", type=float, default=HeadTrainingSettings.eagle_budget_s)
    parser.add_argument("--medusa-budget-s", type=float, default=HeadTrainingSettings.medusa_budget_s)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from specroll.demo.model_cache import load_or_build_demo_models, models_dir

    demo = load_or_build_demo_models()
    settings = HeadTrainingSettings(eagle_budget_s=args.eagle_budget_s, medusa_budget_s=args.medusa_budget_s)
    for name in filter(None, args.retrain.split(",")):
        (heads_dir(models_dir()) / f"{name}.pt").unlink(missing_ok=True)
    prompts = training_prompts(demo.tokenizer, settings.prompts)
    load_or_train_heads(demo.target, prompts, (demo.tokenizer.eos_token_id,), models_dir(), settings)
    print((heads_dir(models_dir()) / "report.json").read_text()[:2000])


if __name__ == "__main__":
    main()
