#!/usr/bin/env python
"""Write PNG grids of the batches the training loop would see, after augmentation.

    python tools/visualize_data.py --config-file configs/shapes/cnn_small.yaml \
        --output-dir /tmp/batches --num-batches 4 [KEY VALUE ...]

Each batch comes from ``build_train_loader`` with ``ClassificationDatasetMapper`` (so flips,
rescales, size caps and aspect-ratio grouping are those of training, for ``SEED``) and is
written as ``batch_<i>.png``: one tile per image at its mapped size, captioned with its
class name and image id.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from typing import Any

from PIL import Image, ImageDraw

from trainkit.config import CfgNode, get_cfg
from trainkit.data import MetadataCatalog, build_train_loader
from trainkit.data.mapping.mappers import ClassificationDatasetMapper

logger = logging.getLogger("trainkit.visualize_data")

_CAPTION_PX = 14
_GAP_PX = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-file", required=True, metavar="FILE")
    parser.add_argument("--output-dir", required=True, help="folder for batch_<i>.png")
    parser.add_argument("--num-batches", type=int, default=4)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")
    args = parser.parse_args(argv)
    if args.num_batches < 1:
        parser.error(f"--num-batches must be >= 1, got {args.num_batches}")
    return args


def load_config(args: argparse.Namespace) -> CfgNode:
    cfg = get_cfg()
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    # Loader workers only add start-up time for a few batches.
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.freeze()
    return cfg


def batch_grid(batch: list[dict[str, Any]], class_names: list[str] | None) -> Image.Image:
    """Tile a batch of mapped samples (uint8 CHW ``"image"``) into one captioned image."""
    cell_w = max(int(sample["image"].shape[2]) for sample in batch) + _GAP_PX
    cell_h = max(int(sample["image"].shape[1]) for sample in batch) + _GAP_PX + _CAPTION_PX
    num_cols = math.ceil(math.sqrt(len(batch)))
    num_rows = math.ceil(len(batch) / num_cols)
    grid = Image.new("RGB", (num_cols * cell_w, num_rows * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for i, sample in enumerate(batch):
        x, y = (i % num_cols) * cell_w, (i // num_cols) * cell_h
        tile = Image.fromarray(sample["image"].permute(1, 2, 0).numpy(), "RGB")
        grid.paste(tile, (x, y))
        label = sample.get("label")
        name = class_names[label] if class_names and label is not None else str(label)
        draw.text((x, y + tile.height + 1), f"{name} #{sample.get('image_id')}", fill=(0, 0, 0))
    return grid


def main(args: argparse.Namespace) -> None:
    cfg = load_config(args)
    os.makedirs(args.output_dir, exist_ok=True)
    class_names = None
    if cfg.DATASETS.TRAIN:
        class_names = MetadataCatalog.get(cfg.DATASETS.TRAIN[0]).get("thing_classes")
    loader = build_train_loader(cfg, mapper=ClassificationDatasetMapper(cfg, is_train=True))
    batches = iter(loader)
    for i in range(args.num_batches):
        batch = next(batches)
        path = os.path.join(args.output_dir, f"batch_{i:03d}.png")
        batch_grid(batch, class_names).save(path)
        sizes = sorted({tuple(s["image"].shape[1:]) for s in batch})
        logger.info("Wrote %s (%d images, sizes %s .. %s)", path, len(batch), sizes[0], sizes[-1])
    print(f"Wrote {args.num_batches} batch grid(s) to {args.output_dir}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        main(parse_args())
    except (FileNotFoundError, KeyError, ValueError) as e:
        # User errors (missing config, unknown key or dataset): one line, no traceback.
        # KeyError's str() would wrap the message in quotes.
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"visualize_data.py: error: {message}", file=sys.stderr)
        sys.exit(2)
