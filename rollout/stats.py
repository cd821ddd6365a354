"""EngineStats: counters of one engine, accumulated across `generate` calls (reset with `reset`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class EngineStats:
    target_forwards: int = 0
    drafter_forwards: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    wall_time_s: float = 0.0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    gamma_per_step: list[int] = field(default_factory=list)
    live_rows_per_step: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_time_s if self.wall_time_s else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens emitted per row per speculative step (accepted drafts + the one target token)."""
        spec_rows = sum(n for g, n in zip(self.gamma_per_step, self.live_rows_per_step) if g > 0)
        return 1.0 + self.accepted / spec_rows if spec_rows else 1.0

    def record_position_counts(self, drafted: list[int], accepted: list[int]) -> None:
        width = max(len(drafted), len(self.drafted_per_position))
        for counts, new in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            counts.extend([0] * (width - len(counts)))
            for i, v in enumerate(new):
                counts[i] += v

    def reset(self) -> None:
        fresh = EngineStats()
        self.__dict__.update(fresh.__dict__)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            acceptance_rate=self.acceptance_rate,
            acceptance_per_position=self.acceptance_per_position,
            tokens_per_s=self.tokens_per_s,
            mean_accepted_len=self.mean_accepted_len,
        )
        return out
