"""What proposes the drafts: the `Drafter` protocol (`protocol`), the kinds' registry (`registry`: one `DrafterSpec`
per kind), the factory (`factory`) and one file per kind — an independent LM (`model`), the suffix drafter (`suffix`,
its index `suffix_index`), the target's first layers (`layer_skip`), an EAGLE-style head (`eagle`), EAGLE-3
(`eagle3`), Medusa heads (`medusa`), a DFlash-style block drafter (`block`) — the trainable heads themselves
(`heads/`, one file per head), what the feature drafters read (`hidden`), the per-row choice between the suffix and
a model drafter (`suffix_or_model`), draft vocabularies (`draft_vocab`) and the published drafter version
(`version`)."""
