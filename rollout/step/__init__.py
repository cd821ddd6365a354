"""The engine's steps, one interface: `chain` (γ drafts per row), `tree` (a token tree per row) on the stages they
share (`base.DecodeStep.run`), and `prefill` (admitted rows into both caches)."""
