"""wattclass: measure Slurm GPU jobs, label them compute- or memory-bound, cap power where it is cheap.

Layers, each importing only from the ones above it in this list (tests/test_layers.py):

1. foundation, in this package's own modules: errors, schema, fsutil, output, the labels and
   the label-table format (``labeltable``), the GPU->job file format (``jobmap``), the job record;
2. boundaries: ``wattclass.gpu`` (NVML, file-state and replay GPUs), ``wattclass.slurm``;
3. components, in flow order: ``wattclass.telemetry`` (node daemon) -> ``wattclass.classifier``
   (labels, model, nightly) -> ``wattclass.plugin`` (policy, Slurm hooks, power caps);
4. applications: ``wattclass.report``, ``wattclass.fleet``, ``wattclass.demo``, and ``cli``.
"""

__version__ = "0.1.0"
