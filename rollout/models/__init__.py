"""Running HF models over ragged rows: the runner (`runner`), the ragged KV cache (`cache`), the lean forward
(`lean`), layers with a per-row state (`mixers`, `recurrent/`), which architectures run (`architectures`),
vocabulary checks (`vocab`), weight loading (`weights`) and every timing helper (`timing`)."""
