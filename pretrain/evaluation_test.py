from pathlib import Path

import pytest

from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.errors import SplitOverlap
from pretrain.evaluation import check_disjoint_from_evaluation


def test_public_identities_from_the_evaluation_folds_are_refused(real_data: Path) -> None:
    # Prepare: a hand-edited manifest that moved one evaluation person into the public set
    good = build_split(real_data, SplitConfig(seed=0))
    moved = next(iter(good.sets["evaluation"]))
    evaluation = {k: v for k, v in good.sets["evaluation"].items() if k != moved}
    public = {**good.sets["public"], moved: good.sets["evaluation"][moved]}
    tampered = SplitManifest(good.config, {"public": public, "devices": good.sets["devices"], "evaluation": evaluation})
    # Execute / Assert
    check_disjoint_from_evaluation(good, real_data, "public")
    with pytest.raises(SplitOverlap, match=r"public identities include 1 people of the evaluation folds"):
        check_disjoint_from_evaluation(tampered, real_data, "public")
