"""GPU backends and the factory that opens one from a ``--backend`` spec.

Specs: ``nvml`` (real GPUs), ``replay:DIR`` (recorded 1 Hz data played as live GPUs; see
``replay``), ``filestate:PATH`` (fake GPUs whose settings live in a JSON file; tests, CI).
Backends are imported lazily so a host without pynvml can still replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wattclass.errors import ConfigError
from wattclass.gpu.base import GpuBackend

SPEC_HELP = "nvml | replay:DIR | filestate:PATH"


def open_backend(spec: str, **options: Any) -> GpuBackend:
    """Open the backend named by ``spec``; ``options`` go to its constructor (e.g. replay speed)."""
    kind, _, arg = spec.partition(":")
    if kind == "nvml" and not arg:
        from wattclass.gpu.nvml import NvmlBackend

        return NvmlBackend(**options)
    if kind == "replay" and arg:
        from wattclass.gpu.replay import ReplayBackend

        return ReplayBackend(Path(arg), **options)
    if kind == "filestate" and arg:
        from wattclass.gpu.filestate import FileStateBackend

        return FileStateBackend(Path(arg), **options)
    raise ConfigError(f"--backend {spec!r}: expected {SPEC_HELP}")


__all__ = ["SPEC_HELP", "GpuBackend", "open_backend"]
