#!/usr/bin/env python
"""Train a model from a config: the main job (completed by the main-job milestone)."""

import sys

if __name__ == "__main__":
    sys.stderr.write("tools/train_net.py: not implemented yet (the main job lands with issue 5)\n")
    sys.exit(2)
