"""detectron2's catalog of Detectron (Caffe2) model files: placeholders.

detectron2 registers a ``catalog://`` path handler here that resolves names such as
``ImageNetPretrained/MSRA/R-50`` to its model zoo's download links. trainkit publishes no
model zoo and loads no Caffe2-era ``.pkl`` weights (see ``trainkit.checkpoint.c2_model_loading``),
so importing this module registers nothing.
"""

from trainkit.utils.detection_only import detection_only

__all__ = ["ModelCatalog", "ModelCatalogHandler"]

_PLACEHOLDER_MODULE = True

_REASON = "not in trainkit (it names the Caffe2-era weights of detectron2's model zoo)"
_ADVICE = "point MODEL.WEIGHTS at a .pth file of your own model"

ModelCatalog = detection_only("ModelCatalog", __name__, "", _ADVICE, reason=_REASON)
ModelCatalogHandler = detection_only("ModelCatalogHandler", __name__, "", _ADVICE, reason=_REASON)
