"""RunState of a plain SimpleTrainer (no yacs config): the data seed comes from its loader."""

import torch
from torch import nn

from trainkit.data import DatasetFromList, build_batch_data_loader
from trainkit.data.samplers import TrainingSampler
from trainkit.engine import SimpleTrainer
from trainkit.engine.run_state import RunState


def _loader(seed):
    dataset = DatasetFromList([torch.zeros(1) for _ in range(8)])
    return build_batch_data_loader(dataset, TrainingSampler(8, seed=seed), 2, num_workers=0)


def test_the_loader_tells_the_seed_it_was_built_with():
    assert _loader(123).seed == 123


def test_without_a_config_the_run_state_saves_the_loaders_seed(tmp_path):
    model = nn.Linear(1, 1)
    trainer = SimpleTrainer(model, _loader(321), torch.optim.SGD(model.parameters(), lr=0.1))
    assert RunState(trainer, output_dir=str(tmp_path)).state_dict()["seed"] == 321
    # An explicit seed still wins.
    assert RunState(trainer, output_dir=str(tmp_path), seed=7).state_dict()["seed"] == 7
