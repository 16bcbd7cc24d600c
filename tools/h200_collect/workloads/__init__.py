"""Workload builders, one module per family."""
