"""detectron2's module path of ``DetectionCheckpointer``.

detectron2's subclass of fvcore's ``Checkpointer`` adds the loading of Caffe2 and pycls
weight files, renaming their layers for its detection models. trainkit refuses those files
with the reason (:mod:`trainkit.checkpoint.c2_model_loading`), so ``DetectionCheckpointer``
is trainkit's :class:`~trainkit.checkpoint.Checkpointer` under detectron2's name, re-exported
here from :mod:`trainkit.checkpoint`.
"""

from trainkit.checkpoint import DetectionCheckpointer

__all__ = ["DetectionCheckpointer"]
