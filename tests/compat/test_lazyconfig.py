"""detectron2's LazyConfig patterns, with ``detectron2`` changed to ``trainkit`` in the imports.

A new-style project's config takes ``train``, an optimizer and a schedule from the model
zoo's common files, describes its model and loader with ``LazyCall``, and its training script
sets ``optimizer.params.model`` before instantiating; the schedule is an fvcore
``ParamScheduler`` that the ``LRScheduler`` hook stretches over ``max_iter``.
"""

import importlib
import textwrap

import pytest
import torch
from torch import nn

from trainkit.engine import SimpleTrainer, hooks

PATHS = {
    "trainkit.config": ["LazyCall", "LazyConfig", "instantiate"],
    "trainkit.config.lazy": ["LazyCall", "LazyConfig"],
    "trainkit.config.instantiate": ["instantiate", "dump_dataclass"],
    "trainkit.model_zoo": ["get", "get_config", "get_config_file", "get_checkpoint_url"],
    "trainkit.model_zoo.model_zoo": ["get", "get_config", "get_config_file", "get_checkpoint_url"],
}


@pytest.mark.parametrize(("module", "names"), PATHS.items())
def test_detectron2_import_paths(module, names):
    # `trainkit.config.instantiate` is both a module and (on the package) the function, as
    # in detectron2: the module is reached through importlib.
    imported = importlib.import_module(module)
    for name in names:
        assert hasattr(imported, name), f"{module}.{name}"


class TinyNet(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = nn.Linear(2, width)
        self.norm = nn.BatchNorm1d(width)

    def forward(self, batch):
        x = torch.stack([b["x"] for b in batch])
        return {"loss": self.norm(self.fc(x)).pow(2).mean()}


def tiny_batches(batch_size=4):
    generator = torch.Generator().manual_seed(0)
    while True:
        yield [{"x": torch.randn(2, generator=generator)} for _ in range(batch_size)]


def test_a_project_config_built_from_the_common_files_trains(tmp_path):
    config = tmp_path / "project.py"
    config.write_text(
        textwrap.dedent(
            """
            from trainkit.config import LazyCall as L
            from trainkit.model_zoo import get_config
            from tests.compat.test_lazyconfig import TinyNet, tiny_batches

            model = L(TinyNet)(width=8)
            dataloader = dict(train=L(tiny_batches)(batch_size=4))
            optimizer = get_config("common/optim.py").SGD
            lr_multiplier = get_config("common/coco_schedule.py").lr_multiplier_1x
            train = get_config("common/train.py").train
            train.max_iter = 6
            train.device = "cpu"
            """
        )
    )
    from trainkit.config import LazyConfig, instantiate

    cfg = LazyConfig.load(str(config))
    cfg = LazyConfig.apply_overrides(cfg, ["optimizer.lr=0.1", "model.width=6"])
    model = instantiate(cfg.model).to(cfg.train.device)
    assert model.fc.out_features == 6
    cfg.optimizer.params.model = model  # the tool's pattern: set before instantiating
    optimizer = instantiate(cfg.optimizer)
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.0, 1e-4}
    trainer = SimpleTrainer(model, instantiate(cfg.dataloader.train), optimizer)
    lr_hook = hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier))
    trainer.register_hooks([lr_hook])
    trainer.train(0, cfg.train.max_iter)
    lrs = [lr for lr, _ in trainer.storage.history("lr").values()]
    # The 1x schedule stretched over 6 iterations: warm-up (0.001 x lr) only at the first,
    # the drop to 0.1 x lr at 2/3 of the training.
    assert lrs == pytest.approx([1e-4, 0.1, 0.1, 0.1, 0.01, 0.01])
