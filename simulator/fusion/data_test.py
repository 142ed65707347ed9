"""Pixel scaling and the official crop-and-flip augmentation."""
import numpy as np
import torch

from simulator.fusion.data import ImageSet, random_crop_flip, resized_crop, to_tensors


def _set(x: np.ndarray) -> ImageSet:
    y = np.zeros(len(x), np.int64)
    return ImageSet(x, y, x[:1], y[:1], classes=1)


def test_channel_stats_are_the_training_pixels_mean_and_std_per_channel() -> None:
    # Prepare
    x = np.random.default_rng(0).integers(0, 256, (50, 6, 6, 3), dtype=np.uint8)
    # Execute
    mean, std = _set(x).channel_stats()
    # Assert
    np.testing.assert_allclose(mean, (x / 255.0).mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(std, (x / 255.0).std(axis=(0, 1, 2)), rtol=1e-9)


def test_dataset_normalisation_standardises_each_channel() -> None:
    # Prepare
    x = np.random.default_rng(1).integers(0, 256, (40, 5, 5, 2), dtype=np.uint8)
    # Execute
    images, _ = to_tensors(x, np.zeros(40, np.int64), dtype=torch.float64, stats=_set(x).channel_stats())
    # Assert
    torch.testing.assert_close(images.mean(dim=(0, 2, 3)), torch.zeros(2, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(images.std(dim=(0, 2, 3), unbiased=False), torch.ones(2, dtype=torch.float64), atol=1e-9, rtol=0)


def test_the_whole_image_crop_is_the_identity_and_flip_mirrors_it() -> None:
    # Prepare
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    one, zero = torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    # Execute
    same = resized_crop(x, one, zero, zero, zero, torch.tensor([False, False]))
    mirrored = resized_crop(x, one, zero, zero, zero, torch.tensor([True, False]))
    # Assert
    torch.testing.assert_close(same, x)
    torch.testing.assert_close(mirrored[0], torch.flip(x[0], dims=[2]))
    torch.testing.assert_close(mirrored[1], x[1])


def test_a_quarter_crop_in_a_corner_magnifies_that_corner() -> None:
    # Prepare: an 8×8 image whose top-left 4×4 quarter is 1, the rest 0
    x = torch.zeros(1, 1, 8, 8, dtype=torch.float64)
    x[..., :4, :4] = 1.0
    t = torch.tensor
    # Execute: area 1/4 with aspect 1 is a 4×4 box; centre (-1, -1) puts it in the top-left corner
    crop = resized_crop(x, t([0.25], dtype=torch.float64), t([0.0], dtype=torch.float64), t([-1.0], dtype=torch.float64),
                        t([-1.0], dtype=torch.float64), t([False]))
    # Assert: all 1 but the last row and column, whose bilinear samples reach half a source pixel past the box
    assert torch.all(crop[..., :7, :7] == 1.0)
    assert float(crop.min()) == 0.5625  # the far corner: (3/4)², a quarter of a pixel into the zeros each way


def test_random_crop_flip_keeps_the_shape_and_changes_images() -> None:
    # Prepare
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    # Execute
    out = random_crop_flip(x)
    # Assert
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert not torch.allclose(out, x)
