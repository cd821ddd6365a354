"""Recurrent layers over ragged rows: the per-row state rings (`linear_state`) and the ragged forwards of
Gated DeltaNet (`gated_delta`) and Mamba / Mamba-2 (`mamba`)."""
