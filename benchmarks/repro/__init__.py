"""Reproducibility probes: does a change, a host or a CPU's kernel set keep the pipeline's bytes."""
