"""A template is the normalised mean of normalised features."""
import numpy as np

from facecore.templates import mean_feature_embedding, mean_feature_length


def test_mean_feature_embedding_is_the_normalised_mean_of_normalised_features() -> None:
    # Prepare: two features of different norms along x and y
    features = np.array([[3.0, 0.0], [0.0, 0.5]])
    # Execute
    w = mean_feature_embedding(features)
    # Assert: the mean of (1,0) and (0,1) is (0.5,0.5) -> (0.7071, 0.7071)
    np.testing.assert_allclose(w, [2**-0.5, 2**-0.5], rtol=1e-6)


def test_mean_feature_length_is_the_length_of_the_mean_unit_feature() -> None:
    # Prepare: the same two features as above, and one photo given twice
    spread, alike = np.array([[3.0, 0.0], [0.0, 0.5]]), np.array([[1.0, 2.0], [2.0, 4.0]])
    # Execute / Assert: the mean of (1,0) and (0,1) is 0.7071 long; photos that agree give 1
    assert abs(mean_feature_length(spread) - 2**-0.5) < 1e-9
    assert abs(mean_feature_length(alike) - 1.0) < 1e-9


def test_the_template_at_its_length_less_a_centre_points_where_the_mean_centred_feature_does() -> None:
    # Prepare: features of one owner that lean along a centre c, as a strong model's do (cosine 0.92 to it)
    rng = np.random.default_rng(0)
    c = np.zeros(128)
    c[0] = 1.0
    own = rng.standard_normal(128) * (c == 0)
    rows = own + 1.6 * rng.standard_normal((12, 128)) * (c == 0)
    rows = 0.4 * rows / np.linalg.norm(rows, axis=1, keepdims=True)
    features = np.sqrt(1 - 0.4**2) * c + rows
    centred = features - c
    target = (centred / np.linalg.norm(centred, axis=1, keepdims=True)).mean(0)
    target /= np.linalg.norm(target)
    # Execute
    template, length = mean_feature_embedding(features), mean_feature_length(features)
    scaled, unit = length * template - c, template - c
    # Assert: the scaled template less the centre is the mean centred feature; the unit one leans towards c
    assert scaled @ target / np.linalg.norm(scaled) > 0.9999
    assert unit @ target / np.linalg.norm(unit) < 0.99
    assert unit @ c / np.linalg.norm(unit) > scaled @ c / np.linalg.norm(scaled)
