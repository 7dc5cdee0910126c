"""Tasks of ``tools/benchmark.py`` that compare trainkit with a hand-written equivalent."""
