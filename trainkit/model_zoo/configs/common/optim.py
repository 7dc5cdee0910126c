"""Optimizers as LazyConfigs, under detectron2's names and keys: ``SGD`` and ``AdamW``.

``params.model`` is left unset: the training script sets it to the model it built before
instantiating the optimizer (``cfg.optimizer.params.model = model``).
"""

import torch

from trainkit.config import LazyCall as L
from trainkit.solver.build import get_default_optimizer_params

SGD = L(torch.optim.SGD)(
    # No weight decay on normalisation layers: decaying their scale fights the normalisation.
    params=L(get_default_optimizer_params)(weight_decay_norm=0.0),
    lr=0.02,
    momentum=0.9,
    weight_decay=1e-4,
)

AdamW = L(torch.optim.AdamW)(
    # base_lr follows the optimizer's lr (an omegaconf interpolation), so overriding
    # optimizer.lr changes every param group's lr.
    params=L(get_default_optimizer_params)(base_lr="${..lr}", weight_decay_norm=0.0),
    lr=1e-4,
    betas=(0.9, 0.999),
    weight_decay=0.1,
)
