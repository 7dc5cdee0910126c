import pytest
import torch
from torch import nn

from trainkit.config import get_cfg
from trainkit.modeling import META_ARCH_REGISTRY, build_model


@META_ARCH_REGISTRY.register()
class _TinyTestArch(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg_device = cfg.MODEL.DEVICE
        self.fc = nn.Linear(2, 1)

    def forward(self, batch):
        return {"loss": self.fc(batch).sum()}


def _cfg(arch, device="cpu"):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = arch
    cfg.MODEL.DEVICE = device
    return cfg


def test_build_model_constructs_registered_arch_on_device():
    model = build_model(_cfg("_TinyTestArch"))
    assert isinstance(model, _TinyTestArch)
    assert model.cfg_device == "cpu"
    assert model.fc.weight.device == torch.device("cpu")


def test_unknown_arch_lists_registered_names():
    with pytest.raises(KeyError, match="_TinyTestArch"):
        build_model(_cfg("_TinyTestArc"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_device_without_cuda_is_explained():
    with pytest.raises(ValueError, match=r"MODEL\.DEVICE"):
        build_model(_cfg("_TinyTestArch", device="cuda"))
