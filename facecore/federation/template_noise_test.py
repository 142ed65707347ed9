"""Template noise keeps the calibrated cosine on average and always returns a unit vector."""
import numpy as np
import pytest

from facecore.federation.template_noise import noisy_template, sigma_for_cosine


@pytest.mark.parametrize("target", [0.95, 0.9, 0.7])
def test_noisy_templates_keep_the_target_cosine_on_average(target: float) -> None:
    # Prepare
    rng = np.random.default_rng(0)
    clean = rng.standard_normal((500, 128))
    clean /= np.linalg.norm(clean, axis=1, keepdims=True)
    # Execute
    noisy = np.stack([noisy_template(w, target, rng) for w in clean])
    # Assert
    np.testing.assert_allclose(np.linalg.norm(noisy, axis=1), 1.0, rtol=1e-5)
    assert np.mean(np.sum(noisy * clean, axis=1)) == pytest.approx(target, abs=0.01)


def test_cosine_one_is_no_noise_and_bad_targets_are_refused() -> None:
    w = np.array([3.0, 4.0])
    np.testing.assert_allclose(noisy_template(w, 1.0, np.random.default_rng(0)), [0.6, 0.8], rtol=1e-6)
    assert sigma_for_cosine(0.9, 128) == pytest.approx(((1 / 0.81 - 1) / 128) ** 0.5)
    with pytest.raises(ValueError, match="target cosine"):
        sigma_for_cosine(0.0, 128)
