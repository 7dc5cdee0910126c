"""Multi-step learning-rate multipliers of the usual "Nx" lengths, under detectron2's names.

A "1x" schedule is 90k iterations at a total batch of 16 images (about 12 COCO epochs);
"Nx" is N times as long. The multiplier is 1, then 0.1, then 0.01, after a linear warm-up
over the first 1000 iterations. ``tools/lazyconfig_train_net.py`` stretches a multiplier
over ``train.max_iter`` (it is defined on [0, 1)), so the milestones are fractions of the
training and keep their place when max_iter changes.
"""

from fvcore.common.param_scheduler import MultiStepParamScheduler

from trainkit.config import LazyCall as L
from trainkit.solver import WarmupParamScheduler

_ITERS_PER_1X = 90000  # 1440k images / 16 per batch
_WARMUP_ITERS = 1000


def default_X_scheduler(num_X):  # noqa: N802, N803 - detectron2's name
    """Return the LazyConfig of the multiplier of an ``num_X``-x schedule.

    Up to 2x the lr drops at 2/3 and 8/9 of the training; longer schedules drop 60k and
    20k iterations before the end (more training at the full lr, the same annealing).

    Args:
        num_X: the length in units of 1x (a positive number).
    """
    total_iters = num_X * _ITERS_PER_1X
    if num_X <= 2:
        # Only the ratios matter: the schedule is stretched over train.max_iter.
        milestones, num_updates = [60000, 80000], 90000
    else:
        milestones, num_updates = [total_iters - 60000, total_iters - 20000], total_iters
    steps = L(MultiStepParamScheduler)(
        values=[1.0, 0.1, 0.01], milestones=milestones, num_updates=num_updates
    )
    return L(WarmupParamScheduler)(
        scheduler=steps,
        warmup_length=_WARMUP_ITERS / total_iters,
        warmup_method="linear",
        warmup_factor=0.001,
    )


lr_multiplier_1x = default_X_scheduler(1)
lr_multiplier_2x = default_X_scheduler(2)
lr_multiplier_3x = default_X_scheduler(3)
lr_multiplier_6x = default_X_scheduler(6)
lr_multiplier_9x = default_X_scheduler(9)
