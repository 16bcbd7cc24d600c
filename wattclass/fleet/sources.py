"""Real telemetry windows that the fleet generator copies, grouped into per-job sequences.

The generator never invents a workload: every synthetic job replays the window sequence of one
real job (``profile``) and every idle GPU replays real no-job windows, so the classifier sees the
value combinations a real H200 produces. This module loads those windows once into flat numpy
columns that the renderer indexes with plain integer arrays (vectorised, cheap to send to worker
processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.errors import DataError
from wattclass.schema import TELEMETRY_V1, conform

#: Float columns carried from the source windows (everything but identity and time).
VALUE_COLUMNS: tuple[str, ...] = tuple(f.name for f in TELEMETRY_V1 if pa.types.is_floating(f.type))


def default_sources() -> list[Path]:
    """The bundled real H200 windows in the v1 schema (the dev set: 21 jobs of ~34 s).

    Not ``data/h200/collected/`` (raw 1 Hz recordings, not windows) nor ``live-nvml/`` (13 s
    jobs whose no-job windows are 2 s inter-job gaps at full power, not idle GPUs); pass them
    with ``--source`` after replaying if wanted.
    """
    base = Path(str(resources.files("wattclass") / "data" / "h200"))
    paths = [base / "telemetry.parquet"]
    return paths


@dataclass(frozen=True)
class SourcePool:
    """Real windows as flat float64 columns: all job profiles first, then the idle windows.

    Profile ``p`` occupies rows ``prof_off[p] : prof_off[p] + prof_len[p]`` in window order;
    idle windows occupy ``idle_off : idle_off + idle_len``. NaN means null in the source.
    """

    columns: dict[str, np.ndarray]
    prof_off: np.ndarray
    prof_len: np.ndarray
    prof_names: tuple[str, ...]  # "<file name>#<job id>" of each profile, for the truth file
    idle_off: int
    idle_len: int
    gpu_model: str

    @property
    def n_profiles(self) -> int:
        return len(self.prof_names)


def load_sources(paths: Sequence[Path]) -> SourcePool:
    """Read real v1 telemetry files and split them into per-job profiles and idle windows.

    A profile is one job on one GPU (host, gpu_uuid, job_id) in time order. Raises DataError
    naming the file when a source is missing or unreadable, and when the sources together hold
    no job windows or no idle windows (both are needed to build a fleet).
    """
    if not paths:
        raise DataError("fleet generator: no source telemetry files given")
    prof_chunks: list[dict[str, np.ndarray]] = []
    prof_names: list[str] = []
    idle_chunks: list[dict[str, np.ndarray]] = []
    models: list[str] = []
    for path in paths:
        path = Path(path)
        try:
            table = pq.read_table(path)
        except FileNotFoundError as exc:
            raise DataError(f"{path}: source telemetry file not found") from exc
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"{path}: cannot read source telemetry: {exc}") from exc
        table = conform(table, path)
        df = table.to_pandas()
        df = df.sort_values(["host", "gpu_uuid", "ts_start"], kind="stable")
        models.extend(m for m in df["gpu_model"].dropna().unique())
        idle = df[df["job_id"].isna()]
        if len(idle):
            idle_chunks.append(
                {c: idle[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in VALUE_COLUMNS}
            )
        jobs = df[df["job_id"].notna()]
        for (_host, _uuid, job), grp in jobs.groupby(["host", "gpu_uuid", "job_id"], sort=True):
            prof_chunks.append({c: grp[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in VALUE_COLUMNS})
            prof_names.append(f"{path.name}#{job}")
    names = ", ".join(str(p) for p in paths)
    if not prof_chunks:
        raise DataError(f"{names}: source telemetry holds no job windows (job_id is null everywhere)")
    if not idle_chunks:
        raise DataError(f"{names}: source telemetry holds no idle windows (rows with null job_id)")
    chunks = prof_chunks + idle_chunks
    columns = {c: np.concatenate([ch[c] for ch in chunks]) for c in VALUE_COLUMNS}
    lens = np.array([len(ch[VALUE_COLUMNS[0]]) for ch in prof_chunks], dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    idle_off = int(lens.sum())
    idle_len = sum(len(ch[VALUE_COLUMNS[0]]) for ch in idle_chunks)
    model = max(set(models), key=models.count) if models else "NVIDIA H200"
    return SourcePool(
        columns=columns,
        prof_off=offs,
        prof_len=lens,
        prof_names=tuple(prof_names),
        idle_off=idle_off,
        idle_len=idle_len,
        gpu_model=model,
    )
