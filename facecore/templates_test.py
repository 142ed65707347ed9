"""A template is the normalised mean of normalised features."""
import numpy as np

from facecore.templates import mean_feature_embedding


def test_mean_feature_embedding_is_the_normalised_mean_of_normalised_features() -> None:
    # Prepare: two features of different norms along x and y
    features = np.array([[3.0, 0.0], [0.0, 0.5]])
    # Execute
    w = mean_feature_embedding(features)
    # Assert: the mean of (1,0) and (0,1) is (0.5,0.5) -> (0.7071, 0.7071)
    np.testing.assert_allclose(w, [2**-0.5, 2**-0.5], rtol=1e-6)
