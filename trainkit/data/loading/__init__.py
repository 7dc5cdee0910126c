"""Loading, workers and prefetch: the loaders that read, map and batch what a plan chose."""
