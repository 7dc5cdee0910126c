"""DefaultPredictor with trainkit's ImageClassifier on a shapes image."""

import numpy as np
import pytest
import torch

from trainkit.checkpoint import Checkpointer
from trainkit.config import ConfigError, get_cfg
from trainkit.data import transforms as T
from trainkit.data.datasets._shapes_render import render_shape_image
from trainkit.engine import DefaultPredictor
from trainkit.engine.defaults import DefaultPredictor as FromDefaults
from trainkit.modeling import build_model


def _cfg(**input_keys):
    cfg = get_cfg()
    cfg.MODEL.DEVICE = "cpu"
    cfg.INPUT.FORMAT, cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = "RGB", 32, 40
    for key, value in input_keys.items():
        setattr(cfg.INPUT, key, value)
    return cfg


@pytest.fixture
def weights(tmp_path):
    torch.manual_seed(0)
    model = build_model(_cfg())
    Checkpointer(model, str(tmp_path)).save("weights")
    return model, str(tmp_path / "weights.pth")


def _seen_inputs(predictor):
    seen = []
    predictor.model.register_forward_pre_hook(lambda module, args: seen.append(args[0][0]))
    return seen


def test_predictor_loads_weights_resizes_and_predicts(weights):
    model, path = weights
    cfg = _cfg()
    cfg.MODEL.WEIGHTS = path
    torch.manual_seed(1)  # another initialisation: the loaded weights must replace it
    predictor = DefaultPredictor(cfg)
    assert FromDefaults is DefaultPredictor and not predictor.model.training
    loaded = predictor.model.state_dict()
    assert all(torch.equal(value, loaded[key]) for key, value in model.state_dict().items())

    rgb = np.asarray(render_shape_image(0, 5, label=2))
    h, w = rgb.shape[:2]
    seen = _seen_inputs(predictor)
    logits = predictor(np.ascontiguousarray(rgb[:, :, ::-1]))  # the caller gives BGR

    new_h, new_w = T.ResizeShortestEdge.get_output_shape(h, w, 32, 40)
    (inputs,) = seen
    assert (inputs["height"], inputs["width"]) == (h, w)
    # INPUT.FORMAT RGB: the model gets the RGB image, resized.
    resized = T.ResizeTransform(h, w, new_h, new_w).apply_image(rgb)
    assert torch.equal(
        inputs["image"], torch.as_tensor(resized.astype("float32").transpose(2, 0, 1))
    )
    model.eval()
    with torch.no_grad():
        expected = model([{"image": inputs["image"]}])[0]
    assert logits.shape == (cfg.MODEL.NUM_CLASSES,)
    torch.testing.assert_close(logits, expected)


def test_min_size_test_zero_keeps_the_size_and_bgr_passes_through():
    predictor = DefaultPredictor(_cfg(MIN_SIZE_TEST=0, FORMAT="BGR"))
    bgr = np.ascontiguousarray(np.asarray(render_shape_image(0, 6, label=1))[:, :, ::-1])
    seen = _seen_inputs(predictor)
    predictor(bgr)
    np.testing.assert_array_equal(seen[0]["image"].numpy().transpose(1, 2, 0), bgr)


def test_predictor_refuses_other_formats():
    with pytest.raises(ConfigError, match="INPUT.FORMAT"):
        DefaultPredictor(_cfg(FORMAT="L"))
