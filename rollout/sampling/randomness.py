"""Counter-based random numbers: every draw a function of (seed, request, position, purpose).

A row's randomness must not depend on when or where it runs — the step, the batch slot, which other
rows share the batch, the γ schedule or the worker — or a seeded call's tokens would change with
them. So nothing here keeps state: each number is a hash of its coordinates, computed as int64
tensor ops on the rows' device (no per-row Python).

    key      = request_keys(seed, prompt_index, sample_index)   # once per request, [N] int64
    uniform  = uniform(key, position, purpose)                   # [n, k] float32 in (0, 1)
    gumbel   = gumbel(key, position, purpose, V)                 # [n, k, V] float32, one per token id

`position` is the absolute sequence position of the token being drawn (prompt tokens included), and
`purpose` (`Purpose`) separates the independent numbers one position may need: the token's Gumbel
noise (shared by the drafter's and the target's draws), and the rejection sampler's accept test and
residual draw.

The hash is splitmix64's finaliser (Steele, Lea, Flood 2014) applied once per coordinate, h ←
mix(h + x · φ) with φ = 0x9E3779B97F4A7C15: a bijective 64-bit mixer with full avalanche, the same
one `java.util.SplittableRandom` uses, written with wrapping int64 multiplies and masked (logical)
right shifts. Uniforms keep 23 bits, as (2m + 1) / 2^24, exactly representable in float32 and
never 0 or 1, so Gumbel noise −log(−log u) is always finite; its resolution bounds how far the
sampled law can be from the exact one (≈ 2^-23 per token).
"""

from __future__ import annotations

import enum
import secrets

import torch


class Purpose(enum.IntEnum):
    """Which of a position's independent random numbers is drawn."""

    TOKEN = 1  # the position's Gumbel noise: the draft from q and the target's draw from p
    ACCEPT = 2  # the rejection sampler's u in "accept iff u · q(d) < p(d)"
    RESIDUAL = 3  # the rejection sampler's draw from norm(max(p − q, 0)) after a rejection
    SIBLING_ACCEPT = 4  # the tree rule's u of the r-th sibling tried at a position (`tree_accept`)


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


GOLDEN = _signed(0x9E3779B97F4A7C15)
MIX1 = _signed(0xBF58476D1CE4E5B9)
MIX2 = _signed(0x94D049BB133111EB)
UNIFORM_BITS = 23


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's `>>` is arithmetic: it copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplies wrap modulo 2^64)."""
    x = (x ^ _shift_right(x, 30)) * MIX1
    x = (x ^ _shift_right(x, 27)) * MIX2
    return x ^ _shift_right(x, 31)


def absorb(h: torch.Tensor, x: torch.Tensor | int) -> torch.Tensor:
    """Fold one more coordinate into a hash (broadcasting `h` against `x`). An int `x` stays a Python
    constant (x · φ wrapped to int64 on the host): no host→device copy per call."""
    if isinstance(x, int):
        return mix(h + _signed((x * (GOLDEN % (1 << 64))) % (1 << 64)))
    return mix(h + x * GOLDEN)


def request_keys(seed: int, prompt_index: torch.Tensor, sample_index: torch.Tensor) -> torch.Tensor:
    """The stream key [N] int64 of each request, from the call's seed and its (prompt, sample) index."""
    seed_hash = mix(torch.full_like(prompt_index, _signed(seed % (1 << 64))))
    return absorb(absorb(seed_hash, prompt_index), sample_index)


def _position_hash(keys: torch.Tensor, positions: torch.Tensor, purpose: Purpose) -> torch.Tensor:
    """keys [n], positions [n, k] → [n, k] int64."""
    return absorb(absorb(keys[:, None], positions), int(purpose))


def _to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """int64 hashes → float32 in (0, 1): the top `UNIFORM_BITS` bits m as (2m + 1) / 2^24."""
    top = _shift_right(bits, 64 - UNIFORM_BITS)
    return (2 * top + 1).float() * 2.0 ** -(UNIFORM_BITS + 1)


def uniform(keys: torch.Tensor, positions: torch.Tensor, purpose: Purpose) -> torch.Tensor:
    """One uniform per (row, position): keys [n], positions [n, k] → [n, k] float32 in (0, 1)."""
    return _to_uniform(_position_hash(keys, positions, purpose))


# Token ids hashed per chunk of about this many elements, in place in two int64 buffers: at V = 151,936, n = 64,
# k = 5 the out-of-place hash allocated ~25 fresh [n, k, V] int64 tensors (371 MiB each), and on a CPU the page
# faults of those allocations, not the arithmetic, were most of its time. On a CPU the chunk is sized for the caches
# (two 2 MiB buffers, each chunk's ~17 passes reading what the last one wrote): measured on a 2-core EPYC (AVX2),
# one thread, 2^18 against 2^21 elements: 12 rows × 1 position at V = 32,768 3.3 vs 6.5 ms, 32 × 3 26 vs 50 ms, at
# V = 151,936 32 × 1 39 vs 86 ms. An accelerator keeps the large chunk: each chunk is ~17 kernel launches.
GUMBEL_CHUNK_ELEMENTS = {"cpu": 1 << 18}
GUMBEL_CHUNK_DEFAULT = 1 << 21


def gumbel(keys: torch.Tensor, positions: torch.Tensor, purpose: Purpose, vocab_size: int,
           token_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Standard Gumbel noise per (row, position, token id): keys [n], positions [n, k] → [n, k, V] float32, or
    [n, k, N] for the ids `token_ids` [N] only (a draft vocabulary: the same values as those columns of the whole).

    Written chunk by chunk of token ids into one float32 tensor, with in-place integer ops in two buffers reused
    by every chunk (the values do not depend on the chunking)."""
    device = keys.device
    base = _position_hash(keys, positions, purpose)[..., None]  # [n, k, 1]
    ids = torch.arange(vocab_size, device=device) if token_ids is None else token_ids.to(device)
    width, lanes = ids.shape[0], max(1, base.numel())
    out = torch.empty(*base.shape[:-1], width, dtype=torch.float32, device=device)  # [n, k, V or N]
    step = max(1, min(width, max(256, GUMBEL_CHUNK_ELEMENTS.get(device.type, GUMBEL_CHUNK_DEFAULT) // lanes)))
    flat_h = torch.empty(lanes * step, dtype=torch.long, device=device)
    flat_tmp = torch.empty_like(flat_h)
    scaled = ids * GOLDEN  # absorb(base, ids)'s x · φ, wrapping
    for start in range(0, width, step):
        c = min(step, width - start)
        h = flat_h[: lanes * c].view(*base.shape[:-1], c)  # the last, narrower chunk reuses the buffers
        tmp = flat_tmp[: lanes * c].view_as(h)
        torch.add(base, scaled[start : start + c], out=h)  # then splitmix64's finaliser, in place
        for bits, factor in ((30, MIX1), (27, MIX2), (31, None)):
            torch.bitwise_right_shift(h, bits, out=tmp)
            tmp.bitwise_and_((1 << (64 - bits)) - 1)
            h.bitwise_xor_(tmp)
            if factor is not None:
                h.mul_(factor)
        # `_to_uniform`: the top UNIFORM_BITS bits m as (2m + 1) / 2^24, then −log(−log u)
        torch.bitwise_right_shift(h, 64 - UNIFORM_BITS, out=tmp)
        tmp.bitwise_and_((1 << UNIFORM_BITS) - 1).mul_(2).add_(1)
        chunk = out[..., start : start + c]
        chunk.copy_(tmp)
        chunk.mul_(2.0 ** -(UNIFORM_BITS + 1)).log_().neg_().log_().neg_()
    return out


def draw_seed() -> int:
    """A fresh seed for a call that was given none (recorded in its rollouts, so they can be regenerated).

    From the OS, not torch's global generator: a call must not move the caller's random stream, nor take
    its seed from whatever else consumed that stream (the cost model's calibration does).
    """
    return secrets.randbits(62)
