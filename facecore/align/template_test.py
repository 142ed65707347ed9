import numpy as np

from facecore.align.template import ARCFACE_TEMPLATE, apply_transform, similarity_transform, warp_to_template


def test_similarity_transform_recovers_a_known_rotation_scale_and_shift() -> None:
    # Prepare
    angle, scale, shift = 0.3, 1.7, np.array([12.0, -5.0])
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    src = ARCFACE_TEMPLATE
    dst = scale * src @ rotation.T + shift
    # Execute
    matrix = similarity_transform(src, dst)
    # Assert
    np.testing.assert_allclose(matrix[:, :2], scale * rotation, atol=1e-9)
    np.testing.assert_allclose(matrix[:, 2], shift, atol=1e-9)


def test_similarity_transform_never_reflects() -> None:
    # Prepare: mirrored points can only be matched by a reflection, which a face warp must not do
    mirrored = ARCFACE_TEMPLATE * np.array([-1.0, 1.0])
    # Execute
    matrix = similarity_transform(mirrored, ARCFACE_TEMPLATE)
    # Assert
    assert np.linalg.det(matrix[:, :2]) > 0


def test_warp_moves_a_marked_landmark_onto_its_template_position() -> None:
    # Prepare: a 250x250 image with a bright dot at a known "left eye" of a scaled, shifted face
    landmarks = ARCFACE_TEMPLATE * 1.5 + np.array([40.0, 30.0])
    image = np.zeros((250, 250, 3), np.uint8)
    x, y = landmarks[0].round().astype(int)
    image[y - 1 : y + 2, x - 1 : x + 2] = 255
    # Execute
    face, matrix = warp_to_template(image, landmarks)
    # Assert
    assert face.shape == (112, 112, 3) and face.dtype == np.uint8
    peak = np.unravel_index(face[..., 0].argmax(), face.shape[:2])
    assert np.hypot(peak[1] - ARCFACE_TEMPLATE[0, 0], peak[0] - ARCFACE_TEMPLATE[0, 1]) < 1.5
    np.testing.assert_allclose(apply_transform(matrix, landmarks), ARCFACE_TEMPLATE, atol=1e-6)
