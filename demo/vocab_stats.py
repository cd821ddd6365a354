"""How much of a vocabulary a set of completions uses: distinct ids, and the share of tokens the most
frequent N ids cover — the numbers that size a draft vocabulary (a drafter that proposes only the top N
ids of the policy's own rollouts loses at most the uncovered share of positions).

    stats = vocab_coverage(token_id_lists, sizes=(1000, 4000, 8000, 16000))
    stats.distinct_ids, stats.coverage[4000]

`python -m specroll.demo.vocab_stats` prints them for the bpe world's task text (canonical solutions in
the SFT mix of styles, and each style alone).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .task import Style

DEFAULT_SIZES = (1_000, 4_000, 8_000, 16_000)


@dataclass(frozen=True)
class VocabCoverage:
    """`num_tokens` counted, `distinct_ids` among them, `coverage[N]`: share of tokens whose id is among
    the N most frequent ids, and `lengths` (tokens per sequence, sorted)."""

    num_tokens: int
    distinct_ids: int
    coverage: dict[int, float]
    lengths: tuple[int, ...]

    def length_quantile(self, q: float) -> int:
        return self.lengths[min(len(self.lengths) - 1, int(q * len(self.lengths)))]


def vocab_coverage(sequences: Iterable[Sequence[int]], sizes: Sequence[int] = DEFAULT_SIZES) -> VocabCoverage:
    """Id frequencies over `sequences` and the share of tokens covered by the top `sizes` ids."""
    if any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes={tuple(sizes)!r} is invalid: ints >= 1")
    counts, lengths = Counter(), []
    for ids in sequences:
        counts.update(ids)
        lengths.append(len(ids))
    total = sum(counts.values())
    if not total:
        raise ValueError("sequences hold no tokens: nothing to count")
    ranked = [n for _, n in counts.most_common()]
    coverage = {n: sum(ranked[:n]) / total for n in sizes}
    return VocabCoverage(total, len(counts), coverage, tuple(sorted(lengths)))


def main(argv: list[str] | None = None) -> int:
    from . import story
    from .bpe import build_bpe_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=4000)
    parser.add_argument("--max-digits", type=int, default=10)
    parser.add_argument("--compact-fraction", type=float, default=0.2)
    args = parser.parse_args(argv)
    tokenizer = build_bpe_tokenizer()
    problems = story.make_problems(args.problems, seed=12_345, max_digits=args.max_digits)
    rng = random.Random(0)
    mix = [Style.COMPACT if rng.random() < args.compact_fraction else Style.VERBOSE for _ in problems]
    print(f"vocabulary: {len(tokenizer)} entries; {args.problems} problems, max_digits={args.max_digits}")
    for label, styles in (("SFT mix", mix), ("verbose", [Style.VERBOSE] * len(problems)),
                          ("compact", [Style.COMPACT] * len(problems))):
        ids = [tokenizer(story.solution(p, s), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for p, s in zip(problems, styles)]
        stats = vocab_coverage(ids)
        shares = ", ".join(f"top {n}: {share:.4f}" for n, share in stats.coverage.items())
        mean = stats.num_tokens / len(ids)
        print(f"{label}: {stats.distinct_ids} distinct ids; tokens/completion mean {mean:.1f}, median "
              f"{stats.length_quantile(0.5)}, p90 {stats.length_quantile(0.9)}, p99 {stats.length_quantile(0.99)}, "
              f"max {stats.lengths[-1]}; {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
