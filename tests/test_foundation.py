"""The shared foundation: schema conformance, atomic writes, the label-table Lua writer."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wattclass import schema
from wattclass.errors import ConfigError, DataError
from wattclass.fsutil import atomic_write_text, atomic_writer, refuse_if_others_can_write
from wattclass.labeltable import TableEntry, lua_string, write_label_table


def test_conform_real_file_keeps_rows_and_types(h200_telemetry: Path) -> None:
    t = schema.conform(pq.read_table(h200_telemetry), h200_telemetry)
    assert t.num_rows == 77
    assert t.schema.equals(schema.TELEMETRY_V1)
    assert t.schema.metadata[schema.METADATA_KEY] == b"wattclass.telemetry/1"


def test_conform_missing_required_column_names_it(h200_telemetry: Path) -> None:
    t = pq.read_table(h200_telemetry).drop_columns(["energy_j"])
    with pytest.raises(DataError, match=r"some\.parquet.*energy_j"):
        schema.conform(t, "some.parquet")


def test_conform_adds_missing_gpm_columns_as_null(h200_telemetry: Path) -> None:
    t = pq.read_table(h200_telemetry).drop_columns(list(schema.GPM_COLUMNS))
    out = schema.conform(t)
    assert out.column("dram_bw_util_pct").null_count == out.num_rows


def test_atomic_write_leaves_old_file_on_error(tmp_path: Path) -> None:
    p = tmp_path / "f.txt"
    atomic_write_text(p, "old")
    with pytest.raises(RuntimeError), atomic_writer(p) as fh:
        fh.write(b"half")
        raise RuntimeError("boom")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_refuse_world_writable(tmp_path: Path) -> None:
    p = tmp_path / "t.lua"
    p.write_text("return {}")
    os.chmod(p, 0o666)
    with pytest.raises(ConfigError, match="others can write"):
        refuse_if_others_can_write(p)
    os.chmod(p, 0o644)
    refuse_if_others_can_write(p)


def test_lua_string_escapes_everything_dangerous() -> None:
    s = lua_string('a"b\\c\nd%]]é')
    assert s == '"a\\034b\\092c\\010d%]]\\195\\169"'


@pytest.mark.skipif(shutil.which("lua5.1") is None, reason="lua5.1 not installed")
def test_label_table_round_trips_through_lua(tmp_path: Path) -> None:
    nasty = 'x"; os.exit(1) --\n%s[[]]\0'
    path = tmp_path / "labels.tsv"
    write_label_table(
        path,
        [
            TableEntry("user_name", "alice", nasty, None, "memory", 0.93, 12, "rule"),
            TableEntry("user", "alice", None, None, "mixed", 0.6, 20, "rule"),
            TableEntry("account", None, None, "physics", "compute", 0.99, 3, "model:1"),
        ],
        policy={"mode": "shadow", "decisions": {"memory": {"cap": "60%"}}},
    )
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    from test_plugin_decide import lua_table_eval

    from wattclass.labeltable import read_label_table

    name = lua_string(nasty)
    e = f"t.by_user_name.alice[{name}]"
    out = lua_table_eval(path, f"{e}.label, {e}.confidence, {e}.n, t.by_account.physics.label, "
                         "t.policy.decisions.memory.cap", tmp_path)
    assert out.split() == ["memory", "0.93", "12", "compute", "60%"]
    back = read_label_table(path)
    assert back["by_user_name"]["alice"][nasty]["label"] == "memory"
    assert back["by_user"]["alice"] == {"label": "mixed", "confidence": 0.6, "n": 20, "source": "rule"}


def test_label_table_rejects_unknown_label(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown label"):
        write_label_table(tmp_path / "x.tsv", [TableEntry("user", "a", None, None, "fast", 1.0, 1, "rule")])
    assert not (tmp_path / "x.tsv").exists()


@pytest.mark.parametrize(("field", "value", "why"), [(5, "bogus", "unknown label 'bogus'"),
                                                     (6, "nan", "confidence nan outside"),
                                                     (6, "1e400", "confidence inf outside")])
def test_reading_a_label_table_names_the_file_and_line_of_a_bad_entry(tmp_path: Path, field: int,
                                                                       value: str, why: str) -> None:
    # the entry was checked only when the whole table was built, with "label table: ..." and no
    # file or line (policy explain --table: which of 40,000 lines?)
    from wattclass.labeltable import read_label_table

    fields = ["entry", "user", "ann", "-", "memory", "0.9", "3", "rule"]
    fields[field - 1] = value
    path = tmp_path / "labels.tsv"
    path.write_text("wattclass-labels\t2\n# a comment\n" + "\t".join(fields) + "\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: {re.escape(why)}"):
        read_label_table(path)


def test_schema_is_pyarrow_schema() -> None:
    assert isinstance(schema.TELEMETRY_V1, pa.Schema)


# -- issue 9 item 11: owner, mode and symlinks, checked at the root ---------------------------------
@pytest.mark.parametrize("damage", ["file_owned_by_nobody", "folder_owned_by_nobody", "symlink_file",
                                    "symlink_folder", "folder_group_writable", "ancestor_owned_by_nobody",
                                    "ancestor_world_writable", "symlink_ancestor"])
def test_untrusted_files_and_folders_are_refused(tmp_path: Path, damage: str) -> None:
    from wattclass.fsutil import read_trusted_text

    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    p = folder / "rec.json"
    p.write_text("{}")
    p.chmod(0o644)
    target = p
    if damage == "file_owned_by_nobody":
        os.chown(p, 65534, 65534)
        want = "owned by uid 65534"
    elif damage == "folder_owned_by_nobody":
        os.chown(folder, 65534, 65534)
        want = "owned by uid 65534"
    elif damage == "symlink_file":
        target = folder / "link.json"
        target.symlink_to(p)
        want = "symlink"
    elif damage == "symlink_folder":
        (tmp_path / "ln").symlink_to(folder)
        target = tmp_path / "ln" / "rec.json"
        want = "symlink"
    elif damage == "ancestor_owned_by_nobody":  # its owner can rename "state" away and put another
        os.chown(tmp_path, 65534, 65534)         # folder there (job_submit.lua checks every folder too)
        want = "owned by uid 65534"
    elif damage == "ancestor_world_writable":
        tmp_path.chmod(0o777)
        want = "others can write"
    elif damage == "symlink_ancestor":
        (tmp_path / "ln").symlink_to(tmp_path)
        target = tmp_path / "ln" / "state" / "rec.json"
        want = "symlink"
    else:
        folder.chmod(0o775)
        want = "others can write"
    with pytest.raises(ConfigError, match=want):
        refuse_if_others_can_write(target)
    with pytest.raises(ConfigError, match=want):
        read_trusted_text(target)


def test_trusted_file_reads(tmp_path: Path) -> None:
    from wattclass.fsutil import read_trusted_text

    p = tmp_path / "ok.json"
    p.write_text('{"a": 1}')
    p.chmod(0o644)
    tmp_path.chmod(0o755)
    assert read_trusted_text(p) == '{"a": 1}'
    with pytest.raises(FileNotFoundError):
        read_trusted_text(tmp_path / "missing")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_file_progress_draws_on_a_terminal_only() -> None:
    from wattclass.progress import FileProgress

    tty = _Tty()
    p = FileProgress(stream=tty)
    p.set_total(3)
    for i in range(3):
        p(i, Path(f"f{i}.parquet"))
    assert "3/3" in tty.getvalue()
    pipe = io.StringIO()
    q = FileProgress(stream=pipe)
    q.set_total(2)
    q(0, Path("a"))
    q(1, Path("b"))
    q.close()
    assert pipe.getvalue() == ""


def test_file_progress_off_a_terminal_does_not_import_tqdm() -> None:
    """A nightly under cron or systemd draws no bar, so it need not load tqdm (issue 15)."""
    import subprocess
    import sys

    code = ("import io, sys\n"
            "from pathlib import Path\n"
            "from wattclass.progress import FileProgress\n"
            "p = FileProgress(stream=io.StringIO())\n"
            "p.set_total(1); p(0, Path('a')); p.close()\n"
            "print('tqdm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("umask", [0o000, 0o002, 0o077])
def test_folders_root_creates_have_mode_0755_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    """A folder the nightly (label table) or the Prolog (state, spool) creates must pass the trust
    checks and be readable by the daemons: under umask 002 (an admin's shell) a 0775
    /etc/slurm/wattclass made job_submit.lua refuse the table, which switched the policy off."""
    from wattclass.fsutil import ensure_trusted_dir

    tmp_path.chmod(0o755)
    old = os.umask(umask)
    try:
        write_label_table(tmp_path / "etc" / "wattclass" / "labels.tsv", [])
        ensure_trusted_dir(tmp_path / "run" / "wattclass" / "caps")
    finally:
        os.umask(old)
    for d in ("etc", "etc/wattclass", "run", "run/wattclass", "run/wattclass/caps"):
        assert stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o755, d
    assert stat.S_IMODE((tmp_path / "etc" / "wattclass" / "labels.tsv").stat().st_mode) == 0o644


def test_the_cli_asks_openblas_for_one_thread_unless_the_environment_says_otherwise() -> None:
    """The wattclass command (wattclass.cli) sets OPENBLAS_NUM_THREADS=1 before NumPy loads (no BLAS
    thread pool spinning at start-up, issue 15); a value the environment gives is kept, and NumPy's
    BLAS then follows it. Importing wattclass as a library changes nothing (review finding)."""
    import subprocess
    import sys

    pytest.importorskip("threadpoolctl")
    code = ("import os, wattclass.cli, numpy, threadpoolctl; print(os.environ['OPENBLAS_NUM_THREADS'], "
            "sorted({i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas'}))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "[1]"]
    lib = "import os, wattclass.report.estimates; print(os.environ.get('OPENBLAS_NUM_THREADS', '-'))"
    out = subprocess.run([sys.executable, "-c", lib], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["-"]
    env["OPENBLAS_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "2"  # kept (the pool's size then depends on the cores)


def test_the_cli_leaves_what_is_alive_at_exit_to_the_os_uncollected(tmp_path: Path) -> None:
    """wattclass.cli skips Python's collection at exit (issue 15: 0.1-0.15 s of every night); exit
    handlers still run (a log file's handler is flushed and closed); an object in a reference cycle
    is no longer finalised at exit (the trade-off, written down here)."""
    import subprocess
    import sys

    code = (
        "import logging, sys\n"
        "import wattclass.cli as c\n"
        "class Cycle:\n"
        "    def __del__(self): print('finalised', flush=True)\n"
        "a = Cycle(); a.me = a; del a\n"
        "h = logging.FileHandler(sys.argv[2]); logging.getLogger('t').addHandler(h)\n"
        "logging.getLogger('t').warning('flushed at exit')\n"
        "if sys.argv[1] == 'cli': c.skip_collection_at_exit()\n")
    runs = {}
    for how in ("plain", "cli"):
        log = tmp_path / f"{how}.log"
        runs[how] = subprocess.run([sys.executable, "-c", code, how, str(log)], capture_output=True,
                                   text=True, check=True).stdout
        assert log.read_text() == "flushed at exit\n"
    assert "finalised" in runs["plain"] and "finalised" not in runs["cli"]
