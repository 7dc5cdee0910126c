"""``python -m benchmarks --task ...`` (from the repository root)."""

from benchmarks.runner import main

if __name__ == "__main__":  # not in spawned processes, which import this module again
    main()
