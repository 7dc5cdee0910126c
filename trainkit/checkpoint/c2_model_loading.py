"""detectron2's Caffe2/Detectron weight-name conversion: placeholders, as trainkit has none.

Projects import ``align_and_update_state_dicts`` at the top of their checkpointer module (to
load Caffe2-era ``.pkl`` backbones by name heuristics), so the names import; calling one
says that such weights are not supported and what to do instead.
"""

from trainkit.utils.detection_only import detection_only

__all__ = ["align_and_update_state_dicts", "convert_basic_c2_names", "convert_c2_detectron_names"]

_REASON = (
    "detectron2's name matching for Caffe2/Detectron .pkl weights, which trainkit does not load"
)
_ADVICE = "convert the weights to a .pth state dict of your model with detectron2 first"


def _placeholder(name: str) -> type:
    return detection_only(name, __name__, "", _ADVICE, reason=_REASON)


align_and_update_state_dicts = _placeholder("align_and_update_state_dicts")
convert_basic_c2_names = _placeholder("convert_basic_c2_names")
convert_c2_detectron_names = _placeholder("convert_c2_detectron_names")
