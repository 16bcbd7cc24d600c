"""Get a Dask cluster for the nightly run: one machine, an existing scheduler, or Slurm jobs.

One machine handles a 10,000-GPU day; bigger sites, or sites that want the nightly done in
minutes, spread it over dask.distributed workers. Where those workers come from is a site
decision, so it lives in a small TOML file rather than in code:

  kind = "local"       a LocalCluster on this machine (tests, single admin node)
  kind = "scheduler"   connect to a running ``dask scheduler`` at ``address``
  kind = "slurm"       a dask_jobqueue.SLURMCluster: workers are Slurm batch jobs (optional
                       dependency ``dask-jobqueue``, in the ``dask`` extra)

``open_client`` turns either a scheduler address or such a file into a ``distributed.Client``
and closes whatever it started on exit. See deploy/SCALEOUT.md and
deploy/dask-slurm.example.toml.
"""

from __future__ import annotations

import contextlib
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattclass.errors import ConfigError
from wattclass.fsutil import read_trusted_bytes

if TYPE_CHECKING:
    from distributed import Client, LocalCluster

KINDS = ("local", "scheduler", "slurm")


@dataclass(frozen=True)
class LocalConfig:
    """A LocalCluster; ``processes=False`` keeps workers as threads (fast start, for tests)."""

    n_workers: int = 2
    threads_per_worker: int = 1
    processes: bool = True
    memory_limit: str = "auto"
    dashboard_address: str | None = None  # None: no dashboard (nothing listening by surprise)


@dataclass(frozen=True)
class SlurmConfig:
    """dask_jobqueue.SLURMCluster settings; each Slurm job runs ``processes`` Dask workers."""

    queue: str | None = None  # partition
    account: str | None = None
    cores: int = 8
    processes: int = 4
    memory: str = "32GiB"
    walltime: str = "01:00:00"
    jobs: int = 2  # scale to this many Slurm jobs (ignored when adapt_maximum_jobs is set)
    adapt_minimum_jobs: int | None = None
    adapt_maximum_jobs: int | None = None
    job_extra_directives: tuple[str, ...] = ()  # e.g. ["--qos=admin", "--constraint=cpu"]
    job_script_prologue: tuple[str, ...] = ()  # e.g. ["source /opt/wattclass/venv/bin/activate"]
    python: str | None = None  # interpreter on the compute nodes
    interface: str | None = None  # network interface the workers bind to (e.g. "ib0")
    local_directory: str | None = None  # worker spill space on the compute node
    log_directory: str | None = None
    scheduler_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterConfig:
    kind: str
    address: str | None = None
    local: LocalConfig = LocalConfig()
    slurm: SlurmConfig = SlurmConfig()


def _section(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from a TOML table, naming any unknown key or wrong type."""
    known = {f.name: f for f in fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        default = getattr(cls(), key)
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}.{key}: expected a list of strings, got {value!r}")
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
        elif isinstance(default, int) or key.startswith("adapt_"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
        elif isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}.{key}: expected a table, got {value!r}")
        elif not isinstance(value, str):
            raise ConfigError(f"{where}.{key}: expected a string, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


def load_config(path: Path) -> ClusterConfig:
    """Read a cluster TOML file; every error names the file and the key.

    Read as the policy is (``read_trusted_bytes``): its ``python`` and ``job_script_prologue``
    become the sbatch scripts the nightly submits, as root under the shipped unit, so a file or
    folder another user can write (or a symlink) would hand them root's jobs."""
    path = Path(path)
    try:
        raw = tomllib.loads(read_trusted_bytes(path, max_bytes=1024 * 1024).decode("utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: cluster config not found") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read cluster config: {exc.strerror}") from exc
    except ConfigError as exc:  # untrusted: name the config as well as the file or folder refused
        raise ConfigError(f"{path}: cluster config not used: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    unknown = set(raw) - {"kind", "address", "local", "slurm"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{path}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    address = raw.get("address")
    if kind == "scheduler" and not isinstance(address, str):
        raise ConfigError(f"{path}: kind = 'scheduler' needs address = 'tcp://host:port'")
    for name in ("local", "slurm"):
        if name in raw and not isinstance(raw[name], dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
    cfg = ClusterConfig(
        kind=kind,
        address=address,
        local=_section(LocalConfig, raw.get("local", {}), f"{path}: local"),
        slurm=_section(SlurmConfig, raw.get("slurm", {}), f"{path}: slurm"),
    )
    s = cfg.slurm
    if s.processes < 1 or s.cores < s.processes:
        raise ConfigError(f"{path}: slurm.cores ({s.cores}) must be >= slurm.processes ({s.processes}) >= 1")
    return cfg


def local_cluster(cfg: LocalConfig | None = None) -> LocalCluster:
    """A LocalCluster on this machine (closed by the caller, or by ``open_client``)."""
    from distributed import LocalCluster

    cfg = cfg or LocalConfig()
    return LocalCluster(
        n_workers=cfg.n_workers,
        threads_per_worker=cfg.threads_per_worker,
        processes=cfg.processes,
        memory_limit=cfg.memory_limit,
        dashboard_address=cfg.dashboard_address,
    )


def slurm_cluster(cfg: SlurmConfig) -> Any:
    """A dask_jobqueue.SLURMCluster, scaled (or adaptive) as configured.

    Its workers are ordinary Slurm jobs, submitted with sbatch from this machine, so this
    machine must be a Slurm submit host that the compute nodes can reach on the network.
    """
    try:
        from dask_jobqueue.slurm import SLURMCluster
    except ImportError as exc:
        raise ConfigError(
            "kind = 'slurm' needs dask-jobqueue: pip install 'wattclass[dask]' (or dask-jobqueue)"
        ) from exc
    kwargs: dict[str, Any] = {
        "cores": cfg.cores,
        "processes": cfg.processes,
        "memory": cfg.memory,
        "walltime": cfg.walltime,
        "job_extra_directives": list(cfg.job_extra_directives),
        "job_script_prologue": list(cfg.job_script_prologue),
        "scheduler_options": {"dashboard_address": None, **cfg.scheduler_options},
    }
    for key in ("queue", "account", "python", "interface", "local_directory", "log_directory"):
        value = getattr(cfg, key)
        if value is not None:
            kwargs[key] = value
    cluster = SLURMCluster(**kwargs)
    if cfg.adapt_maximum_jobs is not None:
        cluster.adapt(minimum_jobs=cfg.adapt_minimum_jobs or 0, maximum_jobs=cfg.adapt_maximum_jobs)
    elif cfg.jobs:
        cluster.scale(jobs=cfg.jobs)
    return cluster


@contextlib.contextmanager
def open_client(
    scheduler: str | None = None,
    config: Path | None = None,
    local: LocalConfig | None = None,
) -> Iterator[Client]:
    """Yield a Client for a scheduler address, a cluster config file, or (neither) a LocalCluster.

    Whatever cluster this function started is closed on exit; an external scheduler is left
    running. Giving both ``scheduler`` and ``config`` is a usage error.
    """
    from distributed import Client

    if scheduler and config:
        raise ConfigError("give either --scheduler or --dask-config, not both")
    cluster: Any = None
    if scheduler:
        target: Any = scheduler
    elif config is not None:
        cfg = load_config(config)
        if cfg.kind == "scheduler":
            target = cfg.address
        elif cfg.kind == "slurm":
            cluster = target = slurm_cluster(cfg.slurm)
        else:
            cluster = target = local_cluster(cfg.local)
    else:
        cluster = target = local_cluster(local)
    try:
        try:
            client = Client(target)
        except OSError as exc:
            raise ConfigError(f"cannot reach the Dask scheduler at {target}: {exc}") from exc
        try:
            yield client
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
