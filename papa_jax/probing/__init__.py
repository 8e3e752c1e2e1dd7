"""Probes and their training: modules, steps, the loop, the feature cache, metrics."""
