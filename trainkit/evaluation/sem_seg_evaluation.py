"""Semantic-segmentation metrics (mIoU, fwIoU, mACC, pACC) from a confusion matrix over ranks."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainkit.evaluation.evaluator import DatasetEvaluator
from trainkit.utils import comm
from trainkit.utils.catalog import DatasetCatalog, MetadataCatalog
from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import PathManager

__all__ = ["SemSegEvaluator", "load_image_into_numpy_array", "sem_seg_metrics"]

logger = logging.getLogger(__name__)

# The label of pixels that count nowhere, when the dataset's metadata sets none (the value
# detectron2's semantic-segmentation datasets use).
_DEFAULT_IGNORE_LABEL = 255


def load_image_into_numpy_array(
    filename: str, copy: bool = False, dtype: np.dtype | str | type | None = None
) -> np.ndarray:
    """Read an image file (e.g. a label map) into a numpy array of its stored values.

    ``copy=True`` always returns a new array; ``False`` copies only when needed (numpy 2
    reads ``np.array(copy=False)`` as "never copy", which a PIL image cannot honour).
    """
    from PIL import Image  # imported here: only evaluation and data reading need PIL

    with PathManager.open(filename, "rb") as f:
        image = Image.open(f)
        return np.array(image, dtype=dtype) if copy else np.asarray(image, dtype=dtype)


def sem_seg_metrics(conf_matrix: np.ndarray, class_names: Sequence[str]) -> dict[str, float]:
    """Compute the metrics of a ``(K + 1) x (K + 1)`` confusion matrix ``[prediction, truth]``.

    Row and column ``K`` hold ignored pixels (the truth's ignore label, out-of-range values)
    and count in no metric. A class absent from the ground truth has no accuracy or IoU
    (NaN) and is left out of the means, as in detectron2.

    Args:
        conf_matrix: pixel counts; ``conf_matrix[p, t]`` pixels of true class ``t`` were
            predicted as ``p``.
        class_names: the ``K`` class names, for the per-class keys.

    Returns:
        In percent: ``mIoU``, ``fwIoU`` (IoU weighted by the class's pixel share), ``IoU-<name>``
        per class, ``mACC`` (mean per-class recall), ``pACC`` (pixel accuracy) and
        ``ACC-<name>`` per class.
    """
    counts = conf_matrix[:-1, :-1].astype(np.float64)
    true_positives = counts.diagonal()
    truth_pixels = counts.sum(axis=0)
    predicted_pixels = counts.sum(axis=1)
    union = truth_pixels + predicted_pixels - true_positives
    present = truth_pixels > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(present, true_positives / truth_pixels, np.nan)
        iou = np.where(present & (union > 0), true_positives / union, np.nan)
    weights = truth_pixels / truth_pixels.sum()
    has_iou = ~np.isnan(iou)
    results: dict[str, float] = {
        "mIoU": 100 * float(np.mean(iou[has_iou])),
        "fwIoU": 100 * float(np.sum(iou[has_iou] * weights[has_iou])),
    }
    results.update({f"IoU-{name}": 100 * float(iou[i]) for i, name in enumerate(class_names)})
    results["mACC"] = 100 * float(np.mean(acc[present]))
    results["pACC"] = 100 * float(true_positives.sum() / truth_pixels.sum())
    results.update({f"ACC-{name}": 100 * float(acc[i]) for i, name in enumerate(class_names)})
    return results


class SemSegEvaluator(DatasetEvaluator):
    """detectron2's semantic-segmentation evaluator, without its COCO (pycocotools) parts.

    Each input's ground truth is read from its record's ``sem_seg_file_name`` (found in
    ``DatasetCatalog.get(dataset_name)`` by ``file_name``); the classes are the metadata's
    ``stuff_classes`` and ``ignore_label`` (255 when unset). Each output is a dict whose
    ``"sem_seg"`` holds ``(K, H, W)`` scores (or an ``(H, W)`` label map) at the ground
    truth's size. ``evaluate`` sums every rank's confusion matrix and returns
    ``{"sem_seg": sem_seg_metrics(...)}`` on rank 0 (``{}`` elsewhere).

    Not ported: the per-pixel COCO-format prediction dump (``sem_seg_predictions.json``,
    RLE through pycocotools) and the boundary IoU (OpenCV).
    """

    def __init__(
        self,
        dataset_name: str,
        distributed: bool = True,
        output_dir: str | None = None,
        *,
        sem_seg_loading_fn: Callable[..., np.ndarray] = load_image_into_numpy_array,
        num_classes: int | None = None,
        ignore_label: int | None = None,
    ) -> None:
        """Create the evaluator of ``dataset_name``.

        Args:
            dataset_name: a dataset registered in ``DatasetCatalog``, whose records have
                ``file_name`` and ``sem_seg_file_name``, and whose metadata has
                ``stuff_classes``.
            distributed: sum the confusion matrices of every rank; False evaluates this
                rank's share only.
            output_dir: if set, the results are also saved there as
                ``sem_seg_evaluation.pth``.
            sem_seg_loading_fn: reads a ground-truth file: ``fn(path, dtype=int)``.
            num_classes: deprecated in detectron2; must match ``len(stuff_classes)``.
            ignore_label: overrides the metadata's ``ignore_label``.

        Raises:
            UsageError: If the metadata has no ``stuff_classes``, ``num_classes`` disagrees
                with it, or a record lacks ``file_name`` or ``sem_seg_file_name``.
        """
        self._dataset_name = dataset_name
        self._distributed = distributed
        self._output_dir = output_dir
        self.sem_seg_loading_fn = sem_seg_loading_fn
        meta = MetadataCatalog.get(dataset_name)
        class_names = meta.get("stuff_classes")
        if not class_names:
            raise UsageError(
                f"SemSegEvaluator({dataset_name!r}) needs the class names: set "
                f"MetadataCatalog.get({dataset_name!r}).stuff_classes = [...] when registering it."
            )
        self._class_names = list(class_names)
        self._num_classes = len(self._class_names)
        if num_classes is not None and num_classes != self._num_classes:
            raise UsageError(
                f"SemSegEvaluator(num_classes={num_classes}) but dataset {dataset_name!r} has "
                f"{self._num_classes} stuff_classes; drop num_classes (it comes from metadata)."
            )
        if ignore_label is None:
            ignore_label = meta.get("ignore_label", _DEFAULT_IGNORE_LABEL)
        self._ignore_label = int(ignore_label)
        self.input_file_to_gt_file = self._ground_truth_files(dataset_name)
        self.reset()

    @staticmethod
    def _ground_truth_files(dataset_name: str) -> dict[str, str]:
        files = {}
        for record in DatasetCatalog.get(dataset_name):
            if "file_name" not in record or "sem_seg_file_name" not in record:
                raise UsageError(
                    f"SemSegEvaluator: a record of dataset {dataset_name!r} has no "
                    f"{'file_name' if 'file_name' not in record else 'sem_seg_file_name'}; "
                    "register records with both (e.g. trainkit.data.datasets.load_sem_seg)."
                )
            files[record["file_name"]] = record["sem_seg_file_name"]
        return files

    def reset(self) -> None:
        size = self._num_classes + 1
        self._conf_matrix = np.zeros((size, size), dtype=np.int64)

    def process(self, inputs: list[dict[str, Any]], outputs: list[Any]) -> None:
        """Add each output's per-pixel prediction against its input's ground-truth file.

        Raises:
            UsageError: If an input is not a record of the dataset, or a prediction and its
                ground truth differ in size.
        """
        for record, output in zip(inputs, outputs):
            prediction = output["sem_seg"] if isinstance(output, dict) else output
            prediction = torch.as_tensor(prediction).detach()
            if prediction.ndim == 3:
                prediction = prediction.argmax(dim=0)
            pred = prediction.to("cpu", torch.int64).numpy()
            gt_file = self.input_file_to_gt_file.get(record.get("file_name", ""))
            if gt_file is None:
                raise UsageError(
                    f"SemSegEvaluator: input {record.get('file_name')!r} is not a record of "
                    f"dataset {self._dataset_name!r}; evaluate the loader of that dataset."
                )
            truth = np.asarray(self.sem_seg_loading_fn(gt_file, dtype=int), dtype=np.int64)
            if pred.shape != truth.shape:
                raise UsageError(
                    f"SemSegEvaluator: the prediction for {record['file_name']} is "
                    f"{pred.shape[0]}x{pred.shape[1]} but its ground truth {gt_file} is "
                    f"{truth.shape[0]}x{truth.shape[1]}; resize the model's output to the "
                    "input's height and width (detectron2's sem_seg_postprocess)."
                )
            self._conf_matrix += self._confusion(pred, truth)

    def _confusion(self, pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
        k = self._num_classes
        # Ignored and out-of-range labels go to the extra bin K, which no metric reads.
        truth = np.where((truth == self._ignore_label) | (truth < 0) | (truth >= k), k, truth)
        pred = np.where((pred < 0) | (pred >= k), k, pred)
        flat = np.bincount((k + 1) * pred.reshape(-1) + truth.reshape(-1), minlength=(k + 1) ** 2)
        return flat.reshape(k + 1, k + 1)

    def evaluate(self) -> dict[str, Any]:
        """Return ``{"sem_seg": metrics}`` on rank 0 (``{}`` on other ranks or with no pixels).

        Collective:
            ``gather`` over all ranks when ``distributed``.
        """
        matrices = [self._conf_matrix]
        if self._distributed:
            matrices = comm.gather(self._conf_matrix)
            if not comm.is_main_process():
                return {}
        conf_matrix = np.sum(matrices, axis=0)
        if conf_matrix[:-1, :-1].sum() == 0:
            logger.warning(
                "SemSegEvaluator on %s saw no labelled pixel; no metrics.", self._dataset_name
            )
            return {}
        results = OrderedDict(sem_seg=sem_seg_metrics(conf_matrix, self._class_names))
        if self._output_dir:
            PathManager.mkdirs(self._output_dir)
            path = os.path.join(self._output_dir, "sem_seg_evaluation.pth")
            with PathManager.open(path, "wb") as f:
                torch.save(dict(results["sem_seg"]), f)
        logger.info("Semantic segmentation results on %s: %s", self._dataset_name, results)
        return results
