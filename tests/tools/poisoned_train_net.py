"""tools/train_net.py with one poisoned training record, for the failing-step replay test.

    TRAINKIT_TEST_POISONED_ID=123 TRAINKIT_TEST_SAVE_AT=36 \
        python poisoned_train_net.py --config-file ... --num-gpus 2 ...

The record whose ``image_id`` is ``$TRAINKIT_TEST_POISONED_ID`` is mapped to a NaN image, so
the loss of the micro-batch holding it is not finite. With ``$TRAINKIT_TEST_SAVE_AT=K`` the
run also saves ``model_<K>.pth`` after iteration K, without tagging it as the newest (a
checkpoint to compare the replay's weights with). The poisoning is in the trainer class
itself, so ``tools/replay_step.py`` (which imports the run's trainer from this file) maps the
record the same way.
"""

import os
import sys

from typing_extensions import override

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import train_net  # noqa: E402

from trainkit.data import build_detection_train_loader  # noqa: E402
from trainkit.data.mapping.mappers import ClassificationDatasetMapper  # noqa: E402
from trainkit.engine import HookBase, default_argument_parser, launch  # noqa: E402

POISONED_ID = int(os.environ.get("TRAINKIT_TEST_POISONED_ID", "-1"))
SAVE_AT = int(os.environ.get("TRAINKIT_TEST_SAVE_AT", "-1"))


class PoisonedMapper(ClassificationDatasetMapper):
    """The classification mapper; one record's image becomes NaN."""

    def __call__(self, record):
        out = super().__call__(record)
        if self.is_train and record["image_id"] == POISONED_ID:
            out["image"] = out["image"].float() * float("nan")
        return out


class SaveAt(HookBase):
    """Save model_<SAVE_AT>.pth after that iteration, untagged (PeriodicCheckpointer's way)."""

    @override
    def after_step(self):
        trainer = self.trainer
        if trainer.iter == SAVE_AT:
            trainer.flush_pending_checks()
            trainer.run_state.prepare_save()
            trainer.checkpointer.save(f"model_{SAVE_AT:07d}", tag_last=False, iteration=SAVE_AT)


class Trainer(train_net.Trainer):
    """The main job's trainer with the poisoned mapper and the extra save."""

    @classmethod
    def build_train_loader(cls, cfg):
        mapper = PoisonedMapper(cfg, is_train=True, dataset_names=cfg.DATASETS.TRAIN)
        return build_detection_train_loader(cfg, mapper=mapper)

    def build_hooks(self):
        hooks = super().build_hooks()
        hooks.insert(-1, SaveAt())
        return hooks


def main(args):
    cfg = train_net.setup(args)
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=args.resume)
    return trainer.train()


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    launch(main, args.num_gpus, dist_url=args.dist_url, args=(args,))
