"""From the target's logits to tokens: counter-based randomness (`randomness`), logits processing (`logits`),
Gumbel-max draws with a step's noise (`noise`) and the speculative accept rules (`accept`)."""
