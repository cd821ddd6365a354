"""SuffixConfig: the suffix drafter's settings (`drafters.suffix.SuffixDrafter`), `EngineConfig.suffix`."""

from __future__ import annotations

from dataclasses import dataclass

from .require import require


@dataclass
class SuffixConfig:
    """The suffix drafter (`drafters.suffix.SuffixDrafter`): `history_tokens` bounds the completions kept across
    `generate` calls (least recently used prompts go first), `prompt_history_tokens` those of one prompt
    (oldest completions go first); a match is looked up over at most `max_match` tokens of the row's end
    and must reach `min_match`; `candidates` earlier occurrences of each n-gram are compared. A row's
    proposal stops before the draft whose chance of being reached and kept (its match length's running
    per-draft acceptance, to the power of its position) falls below `min_survival`."""

    history_tokens: int = 2_000_000
    prompt_history_tokens: int = 32_768
    max_match: int = 32
    min_match: int = 1
    candidates: int = 4
    min_survival: float = 0.5

    def __post_init__(self) -> None:
        for name in ("history_tokens", "prompt_history_tokens", "max_match", "min_match", "candidates"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, f"suffix.{name}",
                    value, "an int >= 1")
        require(isinstance(self.min_survival, (int, float)) and 0 <= self.min_survival < 1, "suffix.min_survival",
                self.min_survival, "a number in [0, 1)")
        require(self.min_match <= self.max_match, "suffix.min_match", self.min_match,
                f"at most suffix.max_match ({self.max_match})")
