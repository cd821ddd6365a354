"""The counter-based generator: bit-exact splitmix64, coordinates kept apart, the laws it claims."""

from __future__ import annotations

import pytest
import torch

from specroll.rollout.sampling.randomness import Purpose, gumbel, mix, request_keys, uniform

MASK = (1 << 64) - 1


def splitmix_finaliser(z: int) -> int:
    """The reference, in Python's unbounded ints."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_mix_is_splitmix64_bit_for_bit():
    values = [0, 1, 2, -1, 2**63 - 1, -(2**63), 123456789123456789, -987654321987654321]
    mixed = mix(torch.tensor(values)).tolist()
    assert [m & MASK for m in mixed] == [splitmix_finaliser(v & MASK) for v in values]


def test_each_coordinate_changes_the_draw():
    keys = request_keys(7, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))  # (prompt, sample) pairs
    assert len(set(keys.tolist())) == 3
    assert request_keys(8, torch.tensor([0]), torch.tensor([0])).item() != keys[0].item()
    positions = torch.tensor([[5, 6]]).expand(3, -1)
    draws = {purpose: uniform(keys, positions, purpose) for purpose in Purpose}
    assert len({tuple(d.flatten().tolist()) for d in draws.values()}) == len(Purpose)
    assert draws[Purpose.TOKEN][0, 0] != draws[Purpose.TOKEN][0, 1]


def test_a_draw_depends_on_its_coordinates_only():
    keys = request_keys(3, torch.arange(6), torch.zeros(6, dtype=torch.long))
    positions = torch.arange(4)[None].expand(6, -1) + 10
    whole = gumbel(keys, positions, Purpose.TOKEN, 32)  # [6, 4, 32]
    picked = gumbel(keys[[4, 1]], positions[[4, 1], 2:3], Purpose.TOKEN, 32)  # other rows, one position
    assert torch.equal(picked[:, 0], whole[[4, 1], 2])


def test_uniforms_and_gumbels_follow_their_laws():
    """200k draws each: mean and variance within 5 standard errors (a correct generator fails ~1e-6)."""
    keys = request_keys(11, torch.arange(2000), torch.zeros(2000, dtype=torch.long))
    positions = torch.arange(100)[None].expand(2000, -1)
    u = uniform(keys, positions, Purpose.ACCEPT).double()
    assert u.min() > 0 and u.max() < 1
    assert u.mean().item() == pytest.approx(0.5, abs=5 * (1 / 12 / u.numel()) ** 0.5)
    assert u.var().item() == pytest.approx(1 / 12, abs=5 * (1 / 180 / u.numel()) ** 0.5)
    g = gumbel(keys[:40], positions[:40, :50], Purpose.TOKEN, 100).double()  # 200k
    assert g.isfinite().all()
    euler, var = 0.5772156649, torch.pi**2 / 6
    assert g.mean().item() == pytest.approx(euler, abs=5 * (var / g.numel()) ** 0.5)
    assert g.var().item() == pytest.approx(var, rel=0.03)


@pytest.mark.parametrize("chunk", [1, 300, 1 << 18, 1 << 30])
def test_gumbel_does_not_depend_on_its_chunking(monkeypatch, chunk):
    """The chunked, in-place hash equals the out-of-place one (`absorb` of each id, `uniform`'s bits) at any chunk
    size: chunks of 256 ids (the floor) with a narrower last one, one chunk, and a draft vocabulary's ids."""
    from specroll.rollout.sampling import randomness

    monkeypatch.setitem(randomness.GUMBEL_CHUNK_ELEMENTS, "cpu", chunk)
    keys = request_keys(5, torch.arange(3), torch.zeros(3, dtype=torch.long))
    positions = torch.tensor([[7, 8], [40, 41], [0, 1]])
    ids = torch.arange(1000)
    bits = randomness.absorb(randomness._position_hash(keys, positions, Purpose.TOKEN)[..., None], ids)
    expected = -(-randomness._to_uniform(bits).log()).log()
    assert torch.equal(gumbel(keys, positions, Purpose.TOKEN, 1000), expected)
    some = torch.tensor([999, 3, 512, 0])
    assert torch.equal(gumbel(keys, positions, Purpose.TOKEN, 1000, some), expected[..., some])
