"""What proposes the drafts: the `Drafter` protocol (`protocol`), the factory (`factory`) and one file per kind —
an independent LM (`model`), the suffix drafter (`suffix`, its index `suffix_index`), the target's first layers
(`layer_skip`), an EAGLE-style head (`eagle`), Medusa heads (`medusa`), the trainable heads themselves (`heads`),
what the feature drafters read (`hidden`) and the per-row choice between the suffix and a model drafter
(`suffix_or_model`)."""
