# long: config to Dask client, with the TLS, HTTP and spill-folder safety of root's clusters
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

Security (docs/admin.md, "Threat model"): the nightly runs as root, and Dask's protocol carries
pickles, so whoever can talk to a scheduler or worker of root's can run code as root. Hence:
``kind = "slurm"`` speaks mutual TLS by default, with a key and certificate made fresh for each
run (``Security.temporary()``), whose worker copies go to ``shared_temp_directory``, a folder root
trusts; plain TCP needs an explicit ``tls = false`` and is logged at WARNING. ``kind = "scheduler"``
may name a ``tls://`` scheduler with the site's certificate files in ``[tls]`` (read as trusted
files); a plain TCP scheduler off loopback is logged at WARNING. The config file itself is read as
a trusted file: it names the interpreter and the prologue that Slurm runs on the workers as root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattclass.errors import ConfigError
from wattclass.fsutil import nearest_existing, read_trusted_bytes, read_trusted_text, refuse_untrusted_dir

if TYPE_CHECKING:
    from distributed import Client, LocalCluster
    from distributed.security import Security

log = logging.getLogger("wattclass.classifier")

KINDS = ("local", "scheduler", "slurm")
#: scheduler_options keys that would undo ``tls`` (the scheduler's protocol and credentials).
_TLS_OWNED_OPTIONS = ("protocol", "security")
#: Where Dask's HTTP servers listen unless the config names a dashboard address. Every scheduler
#: and worker starts one even with no dashboard (metrics, the /info pages with worker logs and
#: call stacks, /json, /proxy), plain HTTP with no authentication, TLS or not; left to Dask it
#: binds every interface (a threads-only LocalCluster, the SLURMCluster's scheduler on :8787 and
#: each worker): root's, on the network.
HTTP_LOOPBACK = "127.0.0.1:0"


@dataclass(frozen=True)
class LocalConfig:
    """A LocalCluster; ``processes=False`` keeps workers as threads (fast start, for tests)."""

    n_workers: int = 2
    threads_per_worker: int = 1
    processes: bool = True
    memory_limit: str = "auto"
    dashboard_address: str | None = None  # None: no dashboard; Dask's HTTP server on loopback


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
    job_script_prologue: tuple[str, ...] = ()  # e.g. ["source /opt/wattclass/bin/activate"]
    python: str | None = None  # interpreter on the compute nodes
    interface: str | None = None  # network interface the workers bind to (e.g. "ib0")
    local_directory: str | None = None  # where each worker job makes its private spill folder (default /tmp)
    log_directory: str | None = None
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    # Mutual TLS between the scheduler (in this process, as root), the workers and the client,
    # with a key and certificate made for this run. false: plain TCP, for an isolated network only.
    tls: bool = True
    # A folder on a filesystem the compute nodes share, where the workers' copy of this run's key
    # and certificate is written (0600, removed when open_client closes the cluster). Required with tls.
    shared_temp_directory: str | None = None


@dataclass(frozen=True)
class TlsFiles:
    """``[tls]``: the site's PEM files for root's client to a standing ``tls://`` scheduler.

    ``ca_file`` is the CA that signed the scheduler's certificate; ``cert`` and ``key`` are the
    client's own (``key`` may be left out when ``cert`` holds the key too). All are read as files
    root trusts (owner root, not writable by group or others, no symlink, on a trusted path).
    """

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class ClusterConfig:
    kind: str
    address: str | None = None
    local: LocalConfig = LocalConfig()
    slurm: SlurmConfig = SlurmConfig()
    tls: TlsFiles | None = None


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
    unknown = set(raw) - {"kind", "address", "local", "slurm", "tls"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{path}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    address = raw.get("address")
    if kind == "scheduler" and not isinstance(address, str):
        raise ConfigError(f"{path}: kind = 'scheduler' needs address = 'tls://host:port' (or 'tcp://host:port')")
    for name in ("local", "slurm", "tls"):
        if name in raw and not isinstance(raw[name], dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
    cfg = ClusterConfig(
        kind=kind,
        address=address,
        local=_section(LocalConfig, raw.get("local", {}), f"{path}: local"),
        slurm=_section(SlurmConfig, raw.get("slurm", {}), f"{path}: slurm"),
        tls=_section(TlsFiles, raw["tls"], f"{path}: tls") if "tls" in raw else None,
    )
    s = cfg.slurm
    if s.processes < 1 or s.cores < s.processes:
        raise ConfigError(f"{path}: slurm.cores ({s.cores}) must be >= slurm.processes ({s.processes}) >= 1")
    # a cluster without a worker never runs a task: the nightly would wait for one forever
    for key in ("n_workers", "threads_per_worker"):
        if getattr(cfg.local, key) < 1:
            raise ConfigError(f"{path}: local.{key} must be at least 1 (no worker runs nothing)")
    if s.adapt_maximum_jobs is not None and s.adapt_maximum_jobs < 1:
        raise ConfigError(f"{path}: slurm.adapt_maximum_jobs must be at least 1 (no worker runs nothing)")
    if s.adapt_minimum_jobs is not None and s.adapt_maximum_jobs is None:
        raise ConfigError(f"{path}: slurm.adapt_minimum_jobs needs slurm.adapt_maximum_jobs (without it "
                          "the cluster is not adaptive and slurm.jobs is used)")
    if s.adapt_minimum_jobs is not None and s.adapt_maximum_jobs is not None \
            and s.adapt_minimum_jobs > s.adapt_maximum_jobs:
        raise ConfigError(f"{path}: slurm.adapt_minimum_jobs ({s.adapt_minimum_jobs}) is above "
                          f"slurm.adapt_maximum_jobs ({s.adapt_maximum_jobs})")
    if kind == "scheduler":
        _check_scheduler_tls(cfg, path)
    elif cfg.tls is not None:
        raise ConfigError(f"{path}: [tls] is for kind = 'scheduler' (kind = 'slurm' makes its own "
                          "certificate for each run)")
    if kind == "slurm":
        _check_slurm_tls(s, f"{path}: slurm")
    return cfg


def _check_scheduler_tls(cfg: ClusterConfig, path: Path) -> None:
    """A ``tls://`` address needs ``[tls]`` files, and ``[tls]`` files need a ``tls://`` address."""
    scheme = _scheme(str(cfg.address), f"{path}: address")
    if cfg.tls is None:
        if scheme == "tls":
            raise ConfigError(f"{path}: address {cfg.address!r} is tls:// but there is no [tls] table "
                              "(ca_file, cert, key)")
        return
    if scheme != "tls":
        raise ConfigError(f"{path}: [tls] is given but address {cfg.address!r} is not tls://host:port")
    for key in ("ca_file", "cert"):
        if not getattr(cfg.tls, key):
            raise ConfigError(f"{path}: tls.{key} is required (a PEM file)")


def _check_slurm_tls(s: SlurmConfig, where: str) -> None:
    """``where``: the config file and table, for the error. The folder itself is checked when used."""
    for key in _TLS_OWNED_OPTIONS:
        if key in s.scheduler_options:
            raise ConfigError(f"{where}.scheduler_options.{key}: not allowed; the scheduler's protocol and "
                              "credentials follow slurm.tls")
    if not s.tls:
        return
    d = s.shared_temp_directory
    if not d:
        raise ConfigError(f"{where}.shared_temp_directory is required with TLS (the default): a root-owned "
                          "folder, mode 0700, on a filesystem the compute nodes share (or tls = false, "
                          "only on an isolated, trusted network)")
    if not os.path.isabs(d) or "$" in d:
        # dask-jobqueue expands '~' and '$VARS' here but writes the name unexpanded into the job
        # script: the folder checked and the folder the workers read must be the same.
        raise ConfigError(f"{where}.shared_temp_directory: {d!r} must be an absolute path without '~' or '$'")


def _scheme(address: str, where: str) -> str:
    from distributed.comm.addressing import parse_address

    try:
        return str(parse_address(address)[0])
    except ValueError as exc:
        raise ConfigError(f"{where}: {address!r} is not a Dask address: {exc}") from exc


def _warn_if_plain_off_loopback(address: str) -> None:
    """WARNING for a scheduler this process trusts without TLS, unless it is on this machine.

    Why: the scheduler sends pickles, which the client (root, for the nightly) unpickles, and
    nothing authenticates a plain TCP peer: whoever runs or impersonates that scheduler runs code
    as this process's user.
    """
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme in ("tls", "inproc"):
        return
    try:
        host = str(parse_host_port(location, 8786)[0])
    except ValueError as exc:
        raise ConfigError(f"{address!r} is not a Dask scheduler address: {exc}") from exc
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: not resolved, so not known to be local
        loopback = False
    if not loopback:
        log.warning("connecting to the Dask scheduler at %s over plain %s: nothing authenticates it, and "
                    "this process (uid %d) runs what it sends (pickles); use a tls:// scheduler with a "
                    "[tls] table in --dask-config (deploy/SCALEOUT.md)", address, scheme, os.geteuid())


def tls_security(files: TlsFiles) -> Security:
    """A client Security from the site's PEM files, read as trusted files, requiring TLS.

    The contents, not the paths, go into the Security object: what was checked is what is used
    (nothing can swap a file between the check and the handshake). They are loaded here too, so a
    key that does not match the certificate is an error naming the files, not a failure to
    "reach the scheduler" at the first connection.
    """
    import ssl

    from distributed.security import Security

    def pem(key: str) -> str | None:
        name = getattr(files, key)
        if not name:
            return None
        try:
            text = read_trusted_text(Path(name))
        except FileNotFoundError as exc:
            raise ConfigError(f"tls.{key} {name}: not found") from exc
        except OSError as exc:
            raise ConfigError(f"tls.{key} {name}: cannot read: {exc.strerror}") from exc
        except ConfigError as exc:
            raise ConfigError(f"tls.{key} {name}: not used: {exc}") from exc
        if "-----BEGIN" not in text:
            raise ConfigError(f"tls.{key} {name}: not a PEM file")
        return text

    ca, cert, key = pem("ca_file"), pem("cert"), pem("key")
    if not ca or not cert:
        raise ConfigError("[tls] needs ca_file and cert")
    security = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)
    try:
        security.get_connection_args("client")  # builds the TLS context from the contents
    except (ssl.SSLError, ValueError) as exc:
        key_file = files.key or "(in cert)"
        raise ConfigError(f"[tls] ca_file {files.ca_file}, cert {files.cert}, key {key_file}: "
                          f"not a usable CA, certificate and key: {exc}") from exc
    return security


def _trusted_shared_temp_directory(cfg: SlurmConfig) -> str:
    """``cfg.shared_temp_directory``, refused unless it is a folder root trusts.

    The workers (root, on the compute nodes) read this run's key and certificate from it, and the
    scheduler accepts whoever holds them: a folder another user can write, or a symlink, would let
    that user read or replace them. Not created when missing: a missing folder on a shared
    filesystem usually means the filesystem is not mounted, and one made on local disk here
    would be invisible to the workers.
    """
    _check_slurm_tls(cfg, "slurm")
    d = str(cfg.shared_temp_directory)
    try:
        refuse_untrusted_dir(Path(d), creates=True)
    except FileNotFoundError as exc:
        raise ConfigError(f"slurm.shared_temp_directory {d}: missing (create it root-owned, mode 0700, on a "
                          "filesystem the compute nodes share)") from exc
    except ConfigError as exc:
        raise ConfigError(f"slurm.shared_temp_directory {d}: {exc}") from exc
    return d


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
        # the HTTP servers are started whatever the dashboard says: on loopback (HTTP_LOOPBACK)
        scheduler_kwargs={"dashboard_address": cfg.dashboard_address or HTTP_LOOPBACK},
        worker_dashboard_address=HTTP_LOOPBACK,
    )


def slurm_cluster(cfg: SlurmConfig) -> Any:
    """A dask_jobqueue.SLURMCluster, scaled (or adaptive) as configured.

    Its workers are ordinary Slurm jobs, submitted with sbatch from this machine, so this
    machine must be a Slurm submit host that the compute nodes can reach on the network. The
    scheduler therefore listens on a routable address: with ``cfg.tls`` (the default) it speaks
    tls:// and accepts only peers holding this run's certificate (``_slurm_security``).
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
        "job_script_prologue": [*_private_local_directory(cfg.local_directory), *cfg.job_script_prologue],
        "local_directory": '"$WATTCLASS_DASK_DIR"',  # expanded by the job script
        "scheduler_options": _scheduler_options(cfg),
        "worker_extra_args": _worker_extra_args(),
    }
    for key in ("queue", "account", "python", "interface", "log_directory"):
        value = getattr(cfg, key)
        if value is not None:
            kwargs[key] = value
    kwargs.update(_slurm_security(cfg))
    if cfg.log_directory is not None:
        _refuse_untrusted_log_directory(cfg.log_directory)
    try:
        cluster = SLURMCluster(**kwargs)
    except OSError as exc:  # e.g. the workers' TLS files cannot be written (a root_squash export)
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise ConfigError(f"cannot start the Dask SLURMCluster: {exc}{cause}") from exc
    try:
        if cfg.adapt_maximum_jobs is not None:
            cluster.adapt(minimum_jobs=cfg.adapt_minimum_jobs or 0, maximum_jobs=cfg.adapt_maximum_jobs)
        elif cfg.jobs:
            cluster.scale(jobs=cfg.jobs)
    except BaseException:
        _close_cluster(cluster)  # its scheduler, and the workers' TLS files with it
        raise
    return cluster


def _refuse_untrusted_log_directory(d: str) -> None:
    """ConfigError unless root trusts ``slurm.log_directory`` (when missing: the folder that
    dask-jobqueue would make it in), as a folder root creates files in.

    Why: slurmstepd opens the workers' output there as root, by names anyone can predict
    (``dask-worker-<job id>.err``), following symlinks: in a folder another user can write (a
    shared scratch, /tmp), a link made first would have root write into any file it points at.
    """
    try:
        refuse_untrusted_dir(nearest_existing(Path(d)), creates=True)
    except ConfigError as exc:
        raise ConfigError(f"slurm.log_directory {d}: {exc}") from exc


def _private_local_directory(base: str | None) -> list[str]:
    """Job script lines that make each worker job's local directory a fresh root-only folder
    (``mktemp -d``) in ``base`` (``slurm.local_directory``, default /tmp), removed when the job
    script ends, in ``$WATTCLASS_DASK_DIR``.

    Why: Dask's workspace is ``<local_directory>/dask-scratch-space``, a fixed name that Dask uses
    as it finds it (it only checks that it can write there, and root always can). In /tmp on a
    compute node that users share, a user who made that folder first owns the folder that holds
    root's worker folders: they can swap one for their own, with spill files the worker (root)
    unpickles, or plant its lock files as symlinks. A name mktemp picks cannot be made first, and
    in a sticky or root-owned ``base`` nobody else can move it.

    The job also works in that folder: DuckDB spills into ``.tmp`` under the working folder, which
    Slurm sets to the nightly's own (its unit's ``/var/lib/wattclass``), and where a compute node
    lacks it, to ``/tmp``, where a user could have made ``.tmp`` first.
    """
    where = base or "/tmp"
    if any(c in where for c in '"\\`\n'):
        raise ConfigError(f"slurm.local_directory {where!r}: no quotes, backslashes, backticks or newlines "
                          "(it goes into the workers' job script)")
    return [f'WATTCLASS_DASK_DIR=$(mktemp -d "{where}/wattclass-dask.XXXXXXXX") || exit 1',
            "trap 'rm -rf -- \"$WATTCLASS_DASK_DIR\"' EXIT",
            'cd "$WATTCLASS_DASK_DIR" || exit 1']


def _scheduler_options(cfg: SlurmConfig) -> dict[str, Any]:
    """The SLURMCluster scheduler's options: the config's, its HTTP server on loopback and no
    dashboard unless the config names a ``dashboard_address`` (``HTTP_LOOPBACK``)."""
    given = cfg.scheduler_options
    return {"dashboard_address": HTTP_LOOPBACK, "dashboard": "dashboard_address" in given, **given}


def _worker_extra_args() -> list[str]:
    """``dask worker`` options for the SLURMCluster's workers: their HTTP server on loopback and no
    dashboard (``HTTP_LOOPBACK``), before root's Dask config ``jobqueue.slurm.worker-extra-args``,
    which may say otherwise (the last of a repeated option wins)."""
    import dask

    configured = dask.config.get("jobqueue.slurm.worker-extra-args", default=None) or []
    return ["--dashboard-address", HTTP_LOOPBACK, "--no-dashboard", *configured]


def _slurm_security(cfg: SlurmConfig) -> dict[str, Any]:
    """SLURMCluster keywords for ``cfg.tls``: a fresh Security and the folder for the workers' copy.

    dask-jobqueue then runs the scheduler on tls://, writes the workers' key and certificate into
    ``shared_temp_directory`` (NamedTemporaryFile: mode 0600; ``_close_cluster`` removes them)
    and gives the workers ``--protocol tls:// --tls-ca-file --tls-cert --tls-key``; both
    ends require the other's certificate (distributed's ``ssl.CERT_REQUIRED``).
    """
    if not cfg.tls:
        _check_slurm_tls(cfg, "slurm")
        log.warning("kind = 'slurm' with tls = false: the Dask scheduler in this process listens on a "
                    "routable address without authentication, so anyone who can reach it can run code "
                    "as uid %d here and on the workers; only for an isolated, trusted network",
                    os.geteuid())
        return {}
    shared = _trusted_shared_temp_directory(cfg)
    from distributed.security import Security

    try:
        security = Security.temporary()
    except ImportError as exc:
        raise ConfigError("kind = 'slurm' with TLS needs the 'cryptography' package: pip install "
                          "'wattclass[dask]'") from exc
    return {"security": security, "shared_temp_directory": shared}


@contextlib.contextmanager
def open_client(
    scheduler: str | None = None,
    config: Path | None = None,
    local: LocalConfig | None = None,
) -> Iterator[Client]:
    """Yield a Client for a scheduler address, a cluster config file, or (neither) a LocalCluster.

    Whatever cluster this function started is closed on exit; an external scheduler is left
    running. Giving both ``scheduler`` and ``config`` is a usage error. A ``tls://`` scheduler
    needs the certificate files of a config's ``[tls]`` table; a plain one off loopback is
    logged at WARNING (``_warn_if_plain_off_loopback``).
    """
    from distributed import Client

    if scheduler and config:
        raise ConfigError("give either --scheduler or --dask-config, not both")
    cluster: Any = None
    security: Security | None = None
    if scheduler:
        if _scheme(scheduler, "--scheduler") == "tls":
            raise ConfigError(f"--scheduler {scheduler}: a tls:// scheduler needs certificate files; give "
                              "them in a kind = 'scheduler' config's [tls] table (--dask-config)")
        _warn_if_plain_off_loopback(scheduler)
        target: Any = scheduler
    elif config is not None:
        cfg = load_config(config)
        if cfg.kind == "scheduler":
            target = cfg.address
            if cfg.tls is not None:
                security = tls_security(cfg.tls)
            else:
                _warn_if_plain_off_loopback(str(target))
        elif cfg.kind == "slurm":
            cluster = target = slurm_cluster(cfg.slurm)
        else:
            cluster = target = local_cluster(cfg.local)
    else:
        cluster = target = local_cluster(local)
    try:
        try:
            client = Client(target, security=security)
        except OSError as exc:
            raise ConfigError(f"cannot reach the Dask scheduler at {target}: {exc}") from exc
        try:
            yield client
        finally:
            client.close()
    finally:
        if cluster is not None:
            _close_cluster(cluster)


def _close_cluster(cluster: Any) -> None:
    """Close ``cluster``, then remove the workers' copy of its TLS key and certificate at once.

    dask-jobqueue (0.9) keeps those files open as NamedTemporaryFile attributes ``_job_<key>``
    and so removes them only when the cluster object is garbage-collected; closing them here
    keeps key material off the shared filesystem as soon as the cluster is gone.
    """
    try:
        cluster.close()
    finally:
        for name in ("_job_key", "_job_cert", "_job_ca_file"):
            handle = getattr(cluster, name, None)
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
