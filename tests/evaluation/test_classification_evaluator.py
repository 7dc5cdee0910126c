"""ClassificationEvaluator: top-k on known logits, and the gather over two ranks."""

import pytest
import torch

from tests.dist import run_on_ranks
from trainkit.evaluation import ClassificationEvaluator


def _inputs(labels):
    return [{"label": label} for label in labels]


def test_top1_top5_on_known_logits():
    ev = ClassificationEvaluator("toy")
    logits = torch.tensor(
        [
            [9.0, 1, 0, 0, 0, 0, 0],  # label 0: top1 hit
            [0.0, 9, 8, 7, 6, 5, 4],  # label 5: rank 5 -> top5 hit, not top1
            [0.0, 9, 8, 7, 6, 5, 4],  # label 6: rank 6 -> miss for both
            [1.0, 2, 3, 9, 0, 0, 0],  # label 3: top1 hit
        ]
    )
    ev.process(_inputs([0, 5, 6, 3]), logits)
    assert ev.evaluate() == {"classification": {"top1": 50.0, "top5": 75.0}}
    ev.reset()
    ev.process(_inputs([1]), logits[:1])
    assert ev.evaluate()["classification"]["top1"] == 0.0


def test_fewer_classes_than_k_counts_every_sample_in_topk():
    ev = ClassificationEvaluator(topk=(1, 5))
    ev.process(_inputs([1, 0]), torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    assert ev.evaluate() == {"classification": {"top1": 50.0, "top5": 100.0}}


def test_shape_mismatch_is_explained():
    with pytest.raises(ValueError, match=r"expects logits of shape \[2, num_classes\]"):
        ClassificationEvaluator().process(_inputs([0, 1]), torch.zeros(3, 4))


def _rank_share():
    from trainkit.utils import comm

    ev = ClassificationEvaluator()
    # rank 0: 2 of 2 correct; rank 1: 0 of 2 correct -> 50 % overall
    label = 0 if comm.get_rank() == 0 else 1
    ev.process(_inputs([label, label]), torch.tensor([[5.0, 0.0], [5.0, 0.0]]))
    return ev.evaluate()


@pytest.mark.distributed
def test_counts_are_summed_over_ranks():
    r0, r1 = run_on_ranks(_rank_share, 2, timeout_s=60)
    assert r0 == {"classification": {"top1": 50.0, "top5": 100.0}}
    assert r1 == {}
