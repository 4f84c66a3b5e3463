"""Tube masks: ratio, tiling over time, and seeding from (seed, step, index) for every mode."""

import pytest
import torch

from raystream.models.videomae import tube_masks

GRID = (2, 4, 4)  # t, h, w tokens


def test_ratio_and_tube_shape():
    m = tube_masks(GRID, 0.9, "per_sample", seed=0, step=0, index=torch.arange(8))
    assert m.shape == (8, 32) and m.dtype == torch.bool
    assert (m.sum(1) == 2 * int(0.9 * 16)).all()
    per_t = m.reshape(8, 2, 16)
    assert torch.equal(per_t[:, 0], per_t[:, 1])  # one spatial mask tiled over time
    big = tube_masks((8, 14, 14), 0.9, "per_sample", seed=0, step=0, index=[0])
    assert abs(big.float().mean().item() - 0.9) < 0.01


def test_per_sample_masks_depend_on_global_index_not_batch_position():
    full = tube_masks(GRID, 0.75, "per_sample", seed=3, step=5, index=torch.arange(8))
    shard = tube_masks(GRID, 0.75, "per_sample", seed=3, step=5, index=torch.arange(4, 8))
    assert torch.equal(full[4:], shard)
    assert len({tuple(r.tolist()) for r in full}) > 1
    assert not torch.equal(full, tube_masks(GRID, 0.75, "per_sample", seed=3, step=6, index=torch.arange(8)))
    assert not torch.equal(full, tube_masks(GRID, 0.75, "per_sample", seed=4, step=5, index=torch.arange(8)))


def test_per_batch_shares_a_mask_per_step_and_fixed_never_changes():
    a = tube_masks(GRID, 0.75, "per_batch", seed=0, step=1, index=torch.arange(4))
    b = tube_masks(GRID, 0.75, "per_batch", seed=0, step=2, index=torch.arange(4))
    assert all(torch.equal(a[0], r) for r in a) and not torch.equal(a, b)
    f1 = tube_masks(GRID, 0.75, "fixed", seed=0, step=1, index=torch.arange(4))
    f2 = tube_masks(GRID, 0.75, "fixed", seed=0, step=99, index=torch.arange(2, 6))
    assert torch.equal(f1, f2)


@pytest.mark.parametrize("ratio, mode, match", [(0.9, "random", "scenario.mask.mode"), (1.0, "fixed", "ratio"),
                                                (0.01, "fixed", "hides 0")])
def test_bad_masks_name_the_key(ratio, mode, match):
    with pytest.raises(ValueError, match=match):
        tube_masks(GRID, ratio, mode, seed=0, step=0, index=[0])
