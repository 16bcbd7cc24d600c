"""wattclass: measure Slurm GPU jobs, label them compute- or memory-bound, cap power where it is cheap.

Layers, each importing only from the ones above it in this list (tests/test_layers.py):

1. foundation, in this package's own modules: errors, schema, fsutil, output, the labels and
   the label-table format (``labeltable``), the GPU->job file format (``jobmap``), the job record;
2. boundaries: ``wattclass.gpu`` (NVML, file-state and replay GPUs), ``wattclass.slurm``;
3. components, in flow order: ``wattclass.telemetry`` (node daemon) -> ``wattclass.classifier``
   (labels, model, nightly) -> ``wattclass.plugin`` (policy, Slurm hooks, power caps);
4. applications: ``wattclass.report``, ``wattclass.fleet``, ``wattclass.demo``, and ``cli``.

One BLAS thread: unless the environment says otherwise, ``OPENBLAS_NUM_THREADS`` is set to 1
here, before anything of wattclass imports NumPy or SciPy. Why (issue 15): OpenBLAS starts its
thread pool when its library loads, and the pool's threads spin waiting for work: 0.08 s of CPU
per library (NumPy's and SciPy's each bring one), a twentieth of the anchor's whole query in a
1,000-GPU night, and CPU the node daemon spends for nothing. wattclass's linear algebra is tiny
(ridge solves of ten inputs, two-parameter calibration fits), and every fit already ran on one
BLAS thread (``classifier.model._OneBlasThread``), so no result changes. Only libraries loaded
after this package see it: a program that imported NumPy first keeps its own pool.
"""

import os as _os

_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
