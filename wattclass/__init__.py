"""wattclass: measure Slurm GPU jobs, label them compute- or memory-bound, cap power where it is cheap.

Subpackages: ``wattclass.telemetry`` (node daemon), ``wattclass.classifier`` (labels, model,
nightly run), ``wattclass.plugin`` (Slurm hooks, policy, power caps), ``wattclass.deploy``
(systemd units, slurm.conf snippets, scale-out).
"""

__version__ = "0.1.0"
