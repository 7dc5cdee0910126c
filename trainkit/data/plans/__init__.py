"""Plans, samplers and mixing: which records make each step, decided before any is loaded."""
