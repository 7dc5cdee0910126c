"""SemSegEvaluator: metrics against a confusion matrix worked out by hand, and over two ranks."""

import math
import os

import numpy as np
import pytest
import torch
from PIL import Image

from tests.dist import run_on_ranks
from trainkit.evaluation import SemSegEvaluator
from trainkit.evaluation.sem_seg_evaluation import sem_seg_metrics
from trainkit.utils.catalog import DatasetCatalog, MetadataCatalog
from trainkit.utils.errors import UsageError

# Ground truth and prediction of one 2x4 image, classes a, b, c; 255 is ignored.
TRUTH = np.array([[0, 0, 1, 1], [2, 255, 1, 0]], dtype=np.uint8)
PRED = np.array([[0, 1, 1, 1], [2, 2, 0, 0]])
# By hand, over the 7 labelled pixels: per class (truth, predicted, hits) = a (3, 3, 2),
# b (3, 3, 2), c (1, 1, 1). IoU = hits / (truth + predicted - hits) = 1/2, 1/2, 1;
# accuracy = hits / truth = 2/3, 2/3, 1; pixel accuracy = 5/7; fwIoU = (3/7)/2 * 2 + 1/7.
EXPECTED = {
    "mIoU": 100 * 2 / 3,
    "fwIoU": 100 * 4 / 7,
    "IoU-a": 50.0,
    "IoU-b": 50.0,
    "IoU-c": 100.0,
    "mACC": 100 * 7 / 9,
    "pACC": 100 * 5 / 7,
    "ACC-a": 100 * 2 / 3,
    "ACC-b": 100 * 2 / 3,
    "ACC-c": 100.0,
}


def _register(name, root, truths):
    records = []
    for i, truth in enumerate(truths):
        gt_file = os.path.join(root, f"{name}_{i}.png")
        Image.fromarray(truth).save(gt_file)
        records.append({"file_name": f"img_{i}.jpg", "sem_seg_file_name": gt_file})
    DatasetCatalog.register(name, lambda: records)
    MetadataCatalog.get(name).set(stuff_classes=["a", "b", "c"], ignore_label=255)


@pytest.fixture
def dataset(tmp_path):
    name = "semseg_eval_toy"
    _register(name, str(tmp_path), [TRUTH, TRUTH])
    yield name
    DatasetCatalog.remove(name)
    MetadataCatalog.remove(name)


def _logits(pred, num_classes=3):
    return torch.nn.functional.one_hot(torch.as_tensor(pred), num_classes).permute(2, 0, 1).float()


def test_metrics_match_the_hand_computed_confusion_matrix(dataset, tmp_path):
    evaluator = SemSegEvaluator(dataset, distributed=False, output_dir=str(tmp_path / "out"))
    evaluator.reset()
    evaluator.process([{"file_name": "img_0.jpg"}], [{"sem_seg": _logits(PRED)}])
    results = evaluator.evaluate()
    assert list(results) == ["sem_seg"]
    assert results["sem_seg"] == pytest.approx(EXPECTED)
    saved = torch.load(tmp_path / "out" / "sem_seg_evaluation.pth", weights_only=True)
    assert saved == pytest.approx(EXPECTED)


def test_label_maps_count_like_scores_and_images_add_up(dataset):
    evaluator = SemSegEvaluator(dataset, distributed=False)
    inputs = [{"file_name": "img_0.jpg"}, {"file_name": "img_1.jpg"}]
    evaluator.process(inputs, [{"sem_seg": torch.as_tensor(PRED)}, {"sem_seg": _logits(PRED)}])
    # Two copies of one image: every ratio is the same as for one.
    assert evaluator.evaluate()["sem_seg"] == pytest.approx(EXPECTED)


def test_a_class_missing_from_the_truth_has_no_iou_and_is_not_averaged():
    conf = np.zeros((4, 4), dtype=np.int64)
    conf[0, 0] = 4  # class a: 4 hits
    conf[2, 0] = 4  # 4 pixels of a predicted as c, and no c in the truth
    metrics = sem_seg_metrics(conf, ["a", "b", "c"])
    assert metrics["IoU-a"] == pytest.approx(50.0)
    assert math.isnan(metrics["IoU-b"]) and math.isnan(metrics["IoU-c"])
    assert metrics["mIoU"] == pytest.approx(50.0) and metrics["pACC"] == pytest.approx(50.0)


def test_size_mismatch_and_missing_metadata_are_one_line_errors(dataset):
    evaluator = SemSegEvaluator(dataset, distributed=False)
    with pytest.raises(UsageError, match=r"prediction for img_0.jpg is 3x3 but its ground truth"):
        evaluator.process([{"file_name": "img_0.jpg"}], [{"sem_seg": torch.zeros(3, 3, 3)}])
    with pytest.raises(UsageError, match=r"input 'other.jpg' is not a record of dataset"):
        evaluator.process([{"file_name": "other.jpg"}], [{"sem_seg": _logits(PRED)}])
    DatasetCatalog.register("semseg_no_classes", lambda: [])
    try:
        with pytest.raises(UsageError, match=r"stuff_classes = \[\.\.\.\]"):
            SemSegEvaluator("semseg_no_classes")
    finally:
        DatasetCatalog.remove("semseg_no_classes")


def _evaluate_one_image_per_rank(root):
    from trainkit.utils import comm

    _register("semseg_eval_ranks", root, [TRUTH, TRUTH])
    evaluator = SemSegEvaluator("semseg_eval_ranks")
    rank = comm.get_rank()
    pred = PRED if rank == 0 else TRUTH.astype(np.int64)  # rank 1 is right everywhere
    evaluator.process([{"file_name": f"img_{rank}.jpg"}], [{"sem_seg": _logits(pred % 255)}])
    return evaluator.evaluate()


@pytest.mark.distributed
@pytest.mark.slow
def test_confusion_matrices_are_summed_over_two_ranks(tmp_path):
    r0, r1 = run_on_ranks(_evaluate_one_image_per_rank, 2, args=(str(tmp_path),), timeout_s=120)
    assert r1 == {}
    # 14 labelled pixels, 12 right: rank 0's 5 of 7 and rank 1's 7 of 7.
    assert r0["sem_seg"]["pACC"] == pytest.approx(100 * 12 / 14)
    # a: truth 6, predicted 6, hits 5 -> IoU 5/7; b the same; c: 2 of 2 -> 1.
    assert r0["sem_seg"]["mIoU"] == pytest.approx(100 * (5 / 7 + 5 / 7 + 1) / 3)
