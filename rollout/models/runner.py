"""ModelRunner: turns (rows, token ids, start positions) into logits through a ragged KV cache.

Every call feeds the same number Q of tokens to each row (ragged calls pad on the right), with
per-row `position_ids = start[:, None] + arange(Q)` and one 4D mask shared by all layers: query q
of row b sees slots `<= start[b] + q`. Eager attention *adds* its mask, so it gets 0 / finfo.min
floats; sdpa takes booleans. Llama-family models run through `lean.LeanDecoder` when `lean`
(the default), everything else through HF's forward.

Sliding-window layers see only the last `sliding_window` positions (HF's `sliding_window_overlay`:
slot > position - window), per row. HF builds that mask itself only from a 2D padding mask with
one offset for the whole batch, and uses a 4D mask as given — so the runner builds one mask per
kind of layer and passes them as the `{layer_type: mask}` dict HF's hybrid models accept, or as
the one tensor when every layer is of one kind (Mistral-style models without `layer_types` apply
`config.sliding_window` to every layer). The cache keeps every slot of a row (no ring buffer): the
window is the mask's business alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .attention import backends
from .cache import STATE_HISTORY, HybridShape, RaggedKVCache, StateShape, probe_layer_shapes
from .hf_compat import cache_kwargs
from .lean import lean_decoder, unsupported_reason
from .mixers import install_ragged_mixers
from .paged import PagedKVCache, PagedLayout
from .rows import Rows, device_index, pick
from .tree_mask import TreeAttention, check_tree
from .weights import cast_module

MASKED_LAYER_TYPES = ("full_attention", "sliding_attention")
# Layers that keep a per-row state in the cache instead of reading K/V slots: they take no mask.
STATE_LAYER_TYPES = ("linear_attention",)
# Layers that mix no tokens (Nemotron-H's MLP / MoE blocks): no mask, no cache.
MIXERLESS_LAYER_TYPES = ("mlp", "moe")
# Layers with attention and a recurrent mixer side by side (Falcon-H1): HF's decoder gives them the
# full-attention mask and the linear-attention one.
HYBRID_LAYER_TYPES = {"hybrid": ("full_attention", "linear_attention")}


def attention_windows(config) -> dict[str, int | None]:
    """The window each kind of attention layer of `config` sees (None: the whole causal prefix);
    `STATE_LAYER_TYPES` are left out (they take no mask).

    Raises `ValueError` for a layer type whose mask the runner cannot build (chunked attention, say).
    """
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None) or None
    declared = _mask_kinds(text)
    kinds = sorted(declared - set(STATE_LAYER_TYPES) - set(MIXERLESS_LAYER_TYPES))
    if not kinds:  # no layer types declared: all full attention; only state layers: no attention mask
        return {} if declared else {"full_attention": window}
    unknown = [kind for kind in kinds if kind not in MASKED_LAYER_TYPES]
    if unknown:
        raise ValueError(f"{text.model_type!r} has layer types {unknown}: the runner builds masks for "
                         f"{', '.join(MASKED_LAYER_TYPES)} only")
    return {kind: window if kind == "sliding_attention" else None for kind in kinds}


def state_layer_kinds(config) -> list[str]:
    """The `STATE_LAYER_TYPES` among the masks `config`'s layers read."""
    kinds = _mask_kinds(config.get_text_config())
    return [kind for kind in STATE_LAYER_TYPES if kind in kinds]


def _mask_kinds(text_config) -> set[str]:
    """The kinds of mask the layers read (a hybrid layer reads two)."""
    kinds = set(getattr(text_config, "layer_types", None) or ())
    return {read for kind in kinds for read in HYBRID_LAYER_TYPES.get(kind, (kind,))}


def check_state_layers(model: PreTrainedModel, shapes: list) -> None:
    """Raise `ValueError` if a layer keeps a recurrent/conv state that no ragged forward handles
    (`mixers.install_ragged_mixers` covers Gated DeltaNet, Mamba and Mamba-2 mixers; installs it on the way)."""
    covered = install_ragged_mixers(model)
    missing = [index for index, shape in enumerate(shapes)
               if isinstance(shape, StateShape | HybridShape) and index not in covered]
    if missing:
        raise ValueError(f"{model.config.model_type!r} layers {missing} keep a recurrent/conv state that the ragged "
                         "cache has no forward for (it has: Gated DeltaNet, Mamba, Mamba-2)")


class ModelRunner:
    """One model (target or drafter) with its ragged cache."""

    def __init__(self, model: PreTrainedModel, batch: int, length: int, dtype: torch.dtype, device: torch.device,
                 lean: bool = True, state_history: int = STATE_HISTORY, paged: PagedLayout | None = None,
                 max_tokens_per_forward: int | None = None):
        """`paged`: keep attention K/V in a `paged.PagedKVCache` of that many blocks (None: dense buffers).
        `max_tokens_per_forward`: `extend` feeds at most that many tokens per forward (None: any)."""
        self.max_tokens_per_forward = max_tokens_per_forward
        self.model = cast_module(model, device, dtype).eval()
        self.lean = lean_decoder(self.model) if lean else None
        self.device = device
        shapes = probe_layer_shapes(self.model)
        check_state_layers(self.model, shapes)
        self.cache = RaggedKVCache(shapes, batch, length, dtype, device, state_history) if paged is None else \
            PagedKVCache(shapes, batch, length, dtype, device, paged.num_blocks, paged.block_size, state_history)
        self.windows = attention_windows(self.model.config)
        self.unmasked = state_layer_kinds(self.model.config)
        # A drafter may have fewer embedding rows than the target (both padded past the same tokenizer
        # vocabulary); ids past its rows are padding ids the target can still emit. Feeding them as the
        # drafter's last row keeps it running; only its draft quality at those positions suffers.
        self.max_input_id = model.get_input_embeddings().weight.shape[0] - 1
        self.additive_mask = model.config._attn_implementation == "eager"
        self.mask_dtype = dtype
        self.num_forwards = 0
        self.capture_layers: tuple[int, ...] | None = None  # `capture_hidden`

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def capture_hidden(self, layers: tuple[int, ...] | None) -> None:
        """What a forward's `hidden` receives: None (the default) the final-normed last hidden state; else, for an
        EAGLE-3 drafter (`drafters.eagle3`), the residual stream entering each of these decoder layers (sorted
        ids; 0 is the embeddings: HF's `output_hidden_states[i]`, vLLM's `aux_hidden_state_layers`), concatenated."""
        count = self.model.config.get_text_config().num_hidden_layers
        if layers is not None and (list(layers) != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < count):
            raise ValueError(f"eagle3 layers {list(layers)} are invalid for a target of {count} layers: distinct "
                             f"sorted ids in [0, {count - 1}]")
        self.capture_layers = None if layers is None else tuple(layers)

    @property
    def hidden_width(self) -> int:
        """The width of what `hidden` receives per position (`capture_hidden`)."""
        width = self.model.config.get_text_config().hidden_size
        return width if self.capture_layers is None else width * len(self.capture_layers)

    @torch.inference_mode()
    def forward(self, rows: Rows, input_ids: torch.Tensor, start: torch.Tensor,
                logits_at: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                num_layers: int | None = None, count: torch.Tensor | None = None,
                head: Callable[[torch.Tensor], torch.Tensor] | None = None, host_start: list[int] | None = None,
                host_count: list[int] | None = None, tree: TreeAttention | None = None) -> torch.Tensor:
        """Feed `input_ids` [n, Q] to `rows` at slots `start` [n] onward; returns logits [n, Q, V].

        With `logits_at` [n] only each row's logits at that query index are returned, [n, V] (the
        lean forward then skips the LM head elsewhere — most of a prefill's cost at a large vocab).
        `hidden` [B, L, H], if given, receives the final-normed last hidden state of query q of row b at
        `hidden[rows[b], start[b] + q]` (`drafters.hidden`; the chosen layers' states instead, [B, L, k·H], after
        `capture_hidden`). `num_layers` runs only the first that many
        decoder layers (layer-skip drafts; lean forward only). `count` [n] (default: all Q) is how many
        of each row's tokens are real; the rest is right padding (kept out of linear-attention state).
        `head` replaces the LM head on the final-normed hidden states (a draft vocabulary's rows,
        `drafters.draft_vocab`): the logits are then [..., N]. `host_start` / `host_count`: `start` and
        `count` as host lists (`RaggedKVCache.plan_write`; None: copied from the device).

        `tree`: the queries are nodes of a token tree (`tree_mask.TreeAttention`): each sees the row's context and
        its ancestors, at its own sequence position; K/V still land at slots `start + q`.

        Does not move `cache.lens`: the caller keeps what it keeps (`rollback`, or `feed`/`extend`).
        """
        if tree is not None:
            check_tree(self.model.config.model_type, bool(self.cache.state_layers), "this")
        query_len = input_ids.shape[1]
        position_ids = self.cache.plan_write(rows, start, query_len, count, host_start, host_count)  # [n, Q]
        kv_len = self.cache.plan.kv_len
        masks = {kind: self._mask(position_ids, kv_len, window, tree) for kind, window in self.windows.items()}
        if masks:
            masks |= dict.fromkeys(self.unmasked)
        # One kind: its tensor; none (state layers only, e.g. Mamba-2): no mask, which those layers ignore.
        mask = masks if len(masks) > 1 else next(iter(masks.values()), None)
        input_ids = input_ids.clamp_max(self.max_input_id)
        hidden_out = None if hidden is None else _writer(hidden, device_index(rows),
                                                         position_ids.clamp_max(hidden.shape[1] - 1))
        position_ids = position_ids if tree is None else tree.positions  # rotary positions (slots stay the writes')
        try:
            with backends(self.device):  # on CUDA: no cuDNN attention (`attention` module)
                if self.lean is not None:
                    return self.lean(input_ids, position_ids, mask, self.cache, logits_at, num_layers, hidden_out, head,
                                     capture=self.capture_layers if hidden_out is not None else None)
                if num_layers is not None:
                    raise ValueError(f"num_layers={num_layers} needs the lean forward, which does not run "
                                     f"{self.model.config.model_type!r} here ({unsupported_reason(self.model)})")
                if hidden_out is not None or head is not None:
                    base = getattr(self.model, self.model.base_model_prefix)
                    capture = self.capture_layers is not None and hidden_out is not None
                    out = base(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=True,
                               output_hidden_states=capture, **cache_kwargs(base, self.cache))
                    states = out.last_hidden_state  # [n, Q, H], final-normed
                    if hidden_out is not None:  # [n, Q, H] or [n, Q, k·H]: the chosen layers' inputs
                        layers = self.capture_layers if capture else ()
                        hidden_out(torch.cat([out.hidden_states[i] for i in layers], -1) if capture else states)
                    logits = (head or self.model.get_output_embeddings())(states)
                else:
                    logits = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                                        use_cache=True, **cache_kwargs(self.model, self.cache)).logits
                if logits_at is None:
                    return logits
                return logits[torch.arange(logits.shape[0], device=self.device), logits_at]
        finally:
            self.cache.plan = None
            self.num_forwards += 1

    def _mask(self, position_ids: torch.Tensor, kv_len: int, window: int | None,
              tree: TreeAttention | None = None) -> torch.Tensor:
        """[n, 1, Q, K]: query q of row b sees slots <= its position (and > position - window); a tree's
        queries see what `tree` says."""
        slots = torch.arange(kv_len, device=self.device)[None, None, :]  # [1, 1, K]
        positions = position_ids[:, :, None]  # [n, Q, 1]
        if tree is not None:
            visible = tree.visible(kv_len, window)
        else:
            visible = slots <= positions
            if window is not None:
                visible &= slots > positions - window
        mask = visible[:, None]
        if self.additive_mask:
            mask = torch.zeros(mask.shape, dtype=self.mask_dtype, device=self.device).masked_fill_(
                ~mask, torch.finfo(self.mask_dtype).min
            )
        return mask

    def feed(self, rows: Rows, input_ids: torch.Tensor, hidden: torch.Tensor | None = None,
             head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Append `input_ids` [n, Q] to every row's cache; returns logits [n, Q, V] (`hidden`, `head`: see
        `forward`)."""
        start, host_start = self.cache.lens[device_index(rows)], self.host_lens(rows)  # [n]
        query_len = input_ids.shape[1]
        logits = self.forward(rows, input_ids, start, hidden=hidden, head=head, host_start=host_start)
        self.cache.set_lens(rows, start + query_len, [s + query_len for s in host_start])
        return logits

    def extend(self, rows: Rows, tokens: torch.Tensor, count: torch.Tensor, hidden: torch.Tensor | None = None,
               head: Callable[[torch.Tensor], torch.Tensor] | None = None, host_count: list[int] | None = None
               ) -> torch.Tensor:
        """Feed each row the `count[b]` tokens of `tokens` [n, L] from its cache length onward.

        Returns the logits at each row's last fed token [n, V] and advances `cache.lens` by `count`.
        Rows are padded on the right to the longest count; a row with count 0 is fed padding only
        and its returned logits are meaningless (`hidden`, `head`: see `forward`; padding lands past the row).
        `host_count`: `count` as a host list (None: copied from the device). A call of more than
        `max_tokens_per_forward` tokens (rows × longest count) runs as several forwards of at most that many
        (chunked prefill: the activations stay bounded; each row's logits come from the chunk its last token is in).
        """
        host_count = count.tolist() if host_count is None else host_count
        query_len = max(max(host_count), 1)
        budget = self.max_tokens_per_forward
        chunk = query_len if budget is None else max(1, min(query_len, budget // len(host_count)))
        if chunk == query_len:
            return self._extend(rows, tokens, count, hidden, head, host_count)
        logits = None
        for lo in range(0, query_len, chunk):
            part = self._extend(rows, tokens, (count - lo).clamp(0, chunk), hidden, head,
                                [min(max(c - lo, 0), chunk) for c in host_count])
            ends_here = ((count > lo) & (count <= lo + chunk))[:, None]  # [n, 1]
            logits = part if logits is None else torch.where(ends_here, part, logits)
        return logits

    def _extend(self, rows: Rows, tokens: torch.Tensor, count: torch.Tensor, hidden: torch.Tensor | None,
                head: Callable[[torch.Tensor], torch.Tensor] | None, host_count: list[int]) -> torch.Tensor:
        start, host_start = self.cache.lens[device_index(rows)], self.host_lens(rows)  # [n]
        query_len = max(max(host_count), 1)
        idx = (start[:, None] + torch.arange(query_len, device=self.device)).clamp_max(tokens.shape[1] - 1)
        last = (count - 1).clamp_min(0)  # [n]
        logits = self.forward(rows, tokens.gather(1, idx), start, logits_at=last, hidden=hidden,
                              count=count, head=head, host_start=host_start, host_count=host_count)  # [n, V]
        self.cache.set_lens(rows, start + count, [s + c for s, c in zip(host_start, host_count)])
        return logits

    def rollback(self, rows: Rows, lens: torch.Tensor, host_lens: list[int] | None = None) -> None:
        """Keep only the first `lens` [n] tokens of each row (rejected drafts are dropped by length alone);
        `host_lens` the same on the host (None: copied from the device)."""
        self.cache.set_lens(rows, lens, host_lens)

    def host_lens(self, rows: Rows) -> list[int]:
        """The cache lengths of `rows`, from the host mirror."""
        return pick(self.cache.host_lens, rows)


def _writer(store: torch.Tensor, rows: slice | torch.Tensor, positions: torch.Tensor):
    """A `hidden_out` that writes hidden states [n, Q, H] into `store` [B, L, H] at `positions` [n, Q]."""
    row_ids = torch.arange(store.shape[0], device=store.device)[rows]  # [n]

    def write(states: torch.Tensor) -> None:
        store[row_ids[:, None], positions] = states.to(store.dtype)

    return write
