"""Durable, atomic file writes and permission checks shared by every component.

Readers (job_submit.lua, the nightly run, dashboards) must never see half a file, so every
output goes to a temporary file in the same folder, is fsynced, then renamed over the target;
the folder is fsynced too so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from wattclass.errors import ConfigError, DataError, WattclassError


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """``mkdir -p`` whose new folders get exactly ``mode``, whatever the umask.

    Root's outputs are read by others that check modes: job_submit.lua refuses a table in a
    group-writable folder, the hooks refuse such a state folder. ``Path.mkdir`` masks with the
    umask (an admin's shell with umask 002 made /etc/slurm/wattclass 0775, so the table was
    refused and the policy was off); folders that already exist are left as they are.
    """
    p = Path(path)
    missing: list[Path] = []
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs stands
            os.mkdir(d, mode)
            os.chmod(d, mode)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o644, binary: bool = True, group: int | None = None,
                  dir_mode: int | None = None) -> Iterator[IO[bytes]]:
    """Yield a file that replaces ``path`` atomically when the block ends without error.

    On error the temporary file is removed and ``path`` is left as it was. Missing folders are
    created with ``dir_mode``, by default the file's mode plus search bits, whatever the umask
    (``make_dirs``). ``group``: the file's group id, set before the rename (so the file never
    appears with another group), for files one daemon's group may read and others may not.
    """
    path = Path(path)
    if dir_mode is None:
        dir_mode = mode | (mode & 0o444) >> 2  # a file 0644 gets folders 0755, 0600 gets 0700
    make_dirs(path.parent, dir_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if group is not None:
            os.chown(tmp, -1, group)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_writer(path, mode) as fh:
        fh.write(data)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically and durably."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def trusted_uids() -> frozenset[int]:
    """Owners whose files a hook may trust: root, and the user running it (a non-root test or dev run)."""
    return frozenset({0, os.geteuid()})


def _refuse_stat(p: Path, st: os.stat_result, is_dir: bool) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{p}: refusing a symlink where root trusts a path")
    if st.st_uid not in trusted_uids():
        raise ConfigError(f"{p}: refusing a {'folder' if is_dir else 'file'} owned by uid {st.st_uid} "
                          "(must be owned by root)")
    sticky_dir = is_dir and bool(st.st_mode & stat.S_ISVTX)
    if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not sticky_dir:
        raise ConfigError(f"{p}: refusing a {'folder' if is_dir else 'file'} that others can write "
                          f"(mode {stat.filemode(st.st_mode)})")


def refuse_untrusted_dir(path: Path, creates: bool = False) -> None:
    """Raise ConfigError unless the folder ``path`` is a real folder (no symlink), owned by root
    and not writable by group or others (a sticky folder such as /tmp is fine), and so is every
    folder above it: whoever can rename a folder on the way can swap the whole subtree (the same
    rule as job_submit.lua's).

    ``creates``: root creates, locks or looks up entries of fixed names in ``path`` itself (cap
    records and their locks, GPU job folders), so ``path`` must not be writable by others even
    when sticky. Sticky only stops others from renaming or removing root's entries, not from
    making a name first: a ``<gpu>.lock`` a user holds would block every hook on that GPU, and a
    record or GPU folder they own is refused, so that GPU (or the whole job) stays uncapped."""
    p = Path(path)
    st = os.lstat(p)
    _refuse_stat(p, st, True)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{p}: not a folder")
    if creates and st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
        raise ConfigError(f"{p}: refusing a folder that others can write (mode {stat.filemode(st.st_mode)}): "
                          "root creates files of fixed names in it; use a folder only root can write")
    for above in Path(os.path.abspath(p)).parents:
        _refuse_stat(above, os.lstat(above), True)


def refuse_untrusted_program(path: Path) -> Path:
    """Raise ConfigError unless root may run ``path``; returns the file it runs.

    Root runs it (the Prolog's squeue from ``--slurm-bin``), so a non-root user who owns or can
    write the program, a folder on its way, or a link that names it, would run their own code as
    root. Unlike a state folder, a Slurm prefix is often reached through links (``/opt/slurm ->
    /opt/slurm-25.11``): a link is followed when root (or the caller) owns it, and every folder on
    the named path and on the real one must be trusted (``_refuse_stat``); the program itself must
    be a regular file root owns that others cannot write.
    """
    named = Path(os.path.abspath(path))
    real = Path(os.path.realpath(named))
    for p in [*reversed(named.parents), named, *reversed(real.parents)]:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted_uids():
                raise ConfigError(f"{p}: refusing a link owned by uid {st.st_uid} on the way to a program "
                                  "root runs")
            continue
        _refuse_stat(p, st, stat.S_ISDIR(st.st_mode))
    st = os.stat(real)
    _refuse_stat(real, st, False)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{real}: not a regular file")
    return real


def nearest_existing(path: Path) -> Path:
    """``path`` or the nearest folder above it that exists: where the missing folders of ``path``
    would be made, by their fixed names (so nobody else may write it, ``refuse_untrusted_dir``'s
    ``creates``)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def refuse_if_others_can_write(path: Path) -> None:
    """Raise ConfigError unless ``path`` and its folders are trusted: owned by root, not writable by
    group or others, and not symlinks (``lstat``: the check sees the link, not its target).

    Hooks run as root; a file that another user owns or can change, or a link another user can
    point elsewhere, would let that user steer root (e.g. a planted cap record). Raises
    FileNotFoundError if ``path`` does not exist.
    """
    p = Path(path)
    refuse_untrusted_dir(p.parent)
    _refuse_stat(p, os.lstat(p), False)


def _open_checked(p: Path, flags: int, refused: tuple[int, ...], what: str) -> int:
    """``p`` opened without following a symlink or blocking (``flags`` added), then checked on the
    open descriptor (fstat: a swap between check and open cannot slip through): a regular file
    root trusts. An open failing with an errno in ``refused`` is a ConfigError "refusing ``what``"."""
    try:
        fd = os.open(p, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno in refused:
            raise ConfigError(f"{p}: refusing {what}") from exc
        raise
    try:
        st = os.fstat(fd)
        _refuse_stat(p, st, False)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{p}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted_bytes(path: Path, max_bytes: int = 16 * 1024 * 1024) -> bytes:
    """Read a file root trusts: opened with O_NOFOLLOW, checked on the open descriptor (fstat, so a
    swap between check and open cannot slip through), its folders up to / checked with lstat.

    Raises ConfigError for an untrusted file or folder, FileNotFoundError if it does not exist.
    """
    p = Path(path)
    refuse_untrusted_dir(p.parent)
    fd = _open_checked(p, os.O_RDONLY, (errno.ELOOP,), "a symlink where root trusts a path")
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise ConfigError(f"{p}: {st.st_size} bytes, more than the {max_bytes} allowed")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(fd)


def open_trusted_append(path: Path) -> IO[str]:
    """Open a log file root appends to (created 0644, its missing folders 0755), as root trusts a
    path: the folder and those above must be trusted (``refuse_untrusted_dir``), the file is
    opened without following a symlink or blocking on a FIFO and must be a regular file, owned by
    root, that others cannot write. ConfigError otherwise.

    Why: a user who could write the log's folder could point the log at any file (root would
    append to /etc/passwd) or make it a FIFO (the hook would block forever, delaying the job)."""
    p = Path(path)
    make_dirs(p.parent)
    refuse_untrusted_dir(p.parent)
    # ELOOP: a symlink; ENXIO: a FIFO without a reader
    fd = _open_checked(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, (errno.ELOOP, errno.ENXIO),
                       "a symlink or FIFO as a log file")
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def read_trusted_text(path: Path) -> str:
    """``read_trusted_bytes`` decoded as UTF-8 (bad bytes are a ConfigError naming the file)."""
    try:
        return read_trusted_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc


def ensure_trusted_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents, mode 0755 whatever the umask) if missing, then refuse
    it unless it is a trusted folder root may create files in (``refuse_untrusted_dir(creates=True)``)."""
    p = Path(path)
    make_dirs(p)
    refuse_untrusted_dir(p, creates=True)
    return p


def check_output_file(path: Path, what: str) -> Path:
    """Refuse, before any work, a file path the command could not write at its end: an existing
    folder, or a parent that is a file. ConfigError naming ``what`` (the option) and the path.

    Why: ``atomic_writer`` fails only at its rename or its temporary file, after the command's
    work (a night's scan, labels stored, a model promoted, then no label table), with a
    traceback (IsADirectoryError, NotADirectoryError) instead of one line naming the option."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p}: is a folder; give a file path")
    _refuse_non_folder_above(p, p.parent, what)
    return p


def check_output_dir(path: Path, what: str) -> Path:
    """``check_output_file`` for a folder the command will write into: refused before any work if
    it, or a folder above it, exists as something else than a folder."""
    p = Path(path)
    _refuse_non_folder_above(p, p, what)
    return p


def _refuse_non_folder_above(p: Path, start: Path, what: str) -> None:
    """ConfigError naming ``what`` and ``p`` if the nearest existing of ``start`` and the folders
    above it is not a folder (a file where a folder of ``p`` must be made)."""
    anc = nearest_existing(start)
    if not anc.is_dir():
        raise ConfigError(f"{what} {p}: {anc} is not a folder")


def ensure_writable_dir(path: Path, what: str) -> Path:
    """Create ``path`` if needed and prove it is writable now, with an error naming ``what``."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".wattclass-probe-"):
            pass
    except OSError as exc:
        raise WattclassError(f"{what} {path} is not writable: {exc.strerror or exc}") from exc
    return path


def split_trusted_files(files: Sequence[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``files`` a run may read, and the others with the reason, keeping the order.

    Why (review): telemetry comes from every node over shared storage. Every run refuses what is
    not a regular file or is a symlink: a FIFO named ``*.parquet`` blocked the nightly forever
    (holding its lock, so every later night failed too), and a link made root read any file as
    telemetry. A run as root also refuses files and folders that non-root users own or can write
    (``_refuse_stat``, the hooks' rule; a folder may be a symlink, whose target path is checked
    too), checking each folder that holds a file and every folder above it once: a user who
    could write there could plant or replace windows of another user's job and change the
    label, and with it the cap, of that job."""
    as_root = os.geteuid() == 0
    dirs: dict[Path, str | None] = {}

    def dir_problem(d: Path) -> str | None:
        # A folder that is a symlink (a data root's telemetry/ on shared storage) is followed:
        # only whoever can write the folder holding the link can re-point it, and that folder is
        # checked too, as is every folder on the link's target path.
        if d in dirs:
            return dirs[d]
        problem = None if d.parent == d else dir_problem(d.parent)
        if problem is None:
            try:
                st = os.lstat(d)
                if stat.S_ISLNK(st.st_mode):
                    problem = dir_problem(Path(os.path.realpath(d)))
                else:
                    _refuse_stat(d, st, True)
            except (ConfigError, OSError) as exc:
                problem = str(exc)
        dirs[d] = problem
        return problem

    # A night's files sit in a few folders: each folder's verdict is looked up by its path's text,
    # not a Path built per file (3,000 of them cost a 1,000-GPU night 0.03 s; issue 15).
    by_parent: dict[str, str | None] = {}

    def parent_problem(p: Path) -> str | None:
        key = os.path.dirname(str(p))
        if key not in by_parent:
            by_parent[key] = dir_problem(Path(os.path.abspath(p.parent)))
        return by_parent[key]

    good: list[Path] = []
    refused: list[tuple[Path, str]] = []
    for f in files:
        p = f if isinstance(f, Path) else Path(f)
        try:
            st = os.lstat(p)
        except OSError as exc:
            refused.append((p, f"cannot stat: {exc.strerror}"))
            continue
        if stat.S_ISLNK(st.st_mode):
            refused.append((p, "a symlink"))
        elif not stat.S_ISREG(st.st_mode):
            refused.append((p, "not a regular file"))
        else:
            problem = None
            if as_root:
                problem = parent_problem(p) or _stat_problem(p, st)
            if problem is None:
                good.append(p)
            else:
                refused.append((p, problem))
    return good, refused


def _stat_problem(p: Path, st: os.stat_result) -> str | None:
    try:
        _refuse_stat(p, st, False)
    except ConfigError as exc:
        return str(exc)
    return None


def require_trusted_files(files: Sequence[Path], what: str = "telemetry") -> list[Path]:
    """``files`` as a list, or DataError naming the first refused ones (``split_trusted_files``).

    For the commands an administrator runs and reads (report, simulate, job): a clear refusal they
    can fix. The nightly, which nobody watches, skips and counts such files instead."""
    good, refused = split_trusted_files(files)
    if refused:
        from wattclass.logsafe import clip

        named = "; ".join(f"{clip(p)}: {clip(why)}" for p, why in refused[:3])
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        raise DataError(f"refusing {len(refused)} {what} file(s): {named}{more}")
    return good
