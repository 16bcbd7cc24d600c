"""A sysadmin's mistakes on the command line: each is refused with one line naming the option and
the value, exit 2 (usage, as documented), before anything is created, opened or half-written.

Before: ``simulate --top -1`` dropped the last row of each table, ``nightly --workers -2`` and
``calibrate --kernel-seconds 0`` ran, ``nightly --data-root <typo>`` created the folder with a
model and a summary in it, ``--date 20261129`` named a partition that never exists, ``--speed
inf`` and ``import --start nan`` were tracebacks. The checks: wattclass/argtypes.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import H200_DATE

from wattclass.argtypes import int_at_least, iso_date, non_negative_float, positive_float
from wattclass.cli import main
from wattclass.gpu.filestate import FileStateBackend
from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import load_policy

REPO = Path(__file__).resolve().parent.parent
POLICY = REPO / "deploy" / "policy.example.toml"


def _tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


# Each bad value with the option that must be named. {T}: the test's folder (mostly paths that do
# not exist: the value must be refused before any path is looked at).
BAD_VALUES: list[tuple[list[str], str, str]] = [
    (["simulate", "--data-root", "{T}/root", "--policy", str(POLICY), "--top"], "--top", "-1"),
    (["simulate", "--data-root", "{T}/root", "--policy", str(POLICY), "--top"], "--top", "0"),
    (["simulate", "--data-root", "{T}/root", "--policy", str(POLICY), "--from"], "--from", "20261129"),
    (["simulate", "--data-root", "{T}/root", "--policy", str(POLICY), "--to"], "--to", "2026-02-30"),
    (["nightly", "--data-root", "{T}/root", "--workers"], "--workers", "-2"),
    (["nightly", "--data-root", "{T}/root", "--lock-timeout"], "--lock-timeout", "-5"),
    (["nightly", "--data-root", "{T}/root", "--lock-timeout"], "--lock-timeout", "nan"),
    (["nightly", "--data-root", "{T}/root", "--date"], "--date", "20261129"),
    (["classify", "--telemetry", "{T}/root", "--out", "{T}/l.parquet", "--date"], "--date", "2026-W48-7"),
    (["report", "--data-root", "{T}/root", "--out", "{T}/r.html", "--date"], "--date", "20261129"),
    (["job", "7", "--data-root", "{T}/root", "--date"], "--date", "2026-11-31"),
    (["model", "train", "--out", "{T}/m", "--folds"], "--folds", "0"),
    (["model", "train", "--out", "{T}/m", "--folds"], "--folds", "1"),
    (["calibrate", "--gpu", "0", "--dry-run", "--out", "{T}/r.json", "--kernel-seconds"], "--kernel-seconds",
     "0"),
    (["calibrate", "--gpu", "0", "--dry-run", "--out", "{T}/r.json", "--kernel-seconds"], "--kernel-seconds",
     "-3"),
    (["calibrate", "--dry-run", "--out", "{T}/r.json", "--gpu"], "--gpu", "-1"),
    (["telemetry", "run", "--data-root", "{T}/d", "--period"], "--period", "inf"),
    (["telemetry", "run", "--data-root", "{T}/d", "--roll-seconds"], "--roll-seconds", "inf"),
    (["telemetry", "run", "--data-root", "{T}/d", "--speed"], "--speed", "inf"),
    (["telemetry", "run", "--data-root", "{T}/d", "--speed"], "--speed", "0"),
    (["telemetry", "run", "--data-root", "{T}/d", "--host"], "--host", "../wal-elsewhere"),
    (["telemetry", "run", "--data-root", "{T}/d", "--host"], "--host", "gpu 01"),
    (["telemetry", "run", "--data-root", "{T}/d", "--host"], "--host", ""),
    (["fleet", "generate", "--gpus", "8", "--date", H200_DATE, "--out", "{T}/f", "--seed"], "--seed", "-1"),
    (["fleet", "generate", "--gpus", "8", "--out", "{T}/f", "--date"], "--date", "20261129"),
]


@pytest.mark.parametrize(("argv", "option", "value"), BAD_VALUES,
                         ids=[f"{a[0]} {o} {v}" for a, o, v in BAD_VALUES])
def test_a_bad_value_is_refused_naming_the_option_and_the_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], option: str, value: str) -> None:
    before = _tree(tmp_path)
    rc = main([a.replace("{T}", str(tmp_path)) for a in argv] + [value])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"argument {option}: " in err and repr(value) in err and "Traceback" not in err, err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("text", ["20261129", "2026-11-31", "2026-W48-1", "2026-11-29T00:00", " 2026-11-29",
                                  ""])
def test_a_day_is_yyyy_mm_dd_and_a_real_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="YYYY-MM-DD"):
        iso_date(text)


def test_good_values_pass_unchanged() -> None:
    assert iso_date("2026-11-29") == "2026-11-29"
    assert positive_float("0.5") == 0.5 and non_negative_float("0") == 0.0 and int_at_least(2)("2") == 2
    for bad in ("nan", "inf", "-inf", "1e999", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(bad)


def test_a_usage_error_is_returned_as_2_and_help_as_0(capsys: pytest.CaptureFixture[str]) -> None:
    """In-process callers (the demo, tests) get the exit code, as for a ConfigError, not SystemExit."""
    assert main(["nightly", "--data-root", "/x", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    assert main(["simulate", "--help"]) == 0
    assert "--top" in capsys.readouterr().out


# -- the known gaps, on real data -------------------------------------------------------------------
def test_simulate_top_below_one_is_refused_not_a_dropped_row(
        h200_day_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--top -1`` sliced each user/account table to all rows but the last, silently."""
    args = ["simulate", "--data-root", str(h200_day_root), "--policy", str(POLICY)]
    assert main([*args, "--top", "1"]) == 0
    capsys.readouterr()
    assert main([*args, "--top", "-1"]) == 2
    assert "argument --top: expected a whole number >= 1, got '-1'" in capsys.readouterr().err


def test_simulate_from_after_to_is_a_usage_error(
        h200_day_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was exit 3, "no job windows in telemetry between 2026-11-30 and 2026-11-01": bad data blamed."""
    rc = main(["simulate", "--data-root", str(h200_day_root), "--policy", str(POLICY),
               "--from", "2026-11-30", "--to", "2026-11-01"])
    err = capsys.readouterr().err
    assert rc == 2 and "--from 2026-11-30 is after --to 2026-11-01" in err, err


def test_nightly_on_a_mistyped_data_root_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The night created the typo (classifier/, its lock, the packaged model, a summary) and then
    said "no usable telemetry", as for an idle day; with --allow-empty it even exited 0."""
    typo = tmp_path / "wattclas" / "data"
    rc = main(["nightly", "--data-root", str(typo), "--date", H200_DATE, "--no-retrain", "--allow-empty",
               "--table-out", str(tmp_path / "labels.tsv")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--data-root {typo}: no such folder" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["report", "--out", "{T}/r.html"], ["job", "7"], ["simulate", "--policy", str(POLICY)], ["effects"]])
def test_every_reader_of_a_data_root_calls_a_mistyped_one_a_usage_error(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """report and job said exit 3 ("no telemetry/ folder", unusable data) where the nightly says 2;
    a folder that is not there is the command line's fault, not the data's."""
    typo = tmp_path / "wattclas"
    rc = main([a.replace("{T}", str(tmp_path)) for a in argv] + ["--data-root", str(typo)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--data-root {typo}: no such folder" in err, err
    assert list(tmp_path.iterdir()) == []


def test_nightly_checks_the_dask_config_before_taking_the_lock(
        h200_day_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing --dask-config was found only after DATA_ROOT/classifier/ and its lock were made."""
    missing = tmp_path / "dask.toml"
    rc = main(["nightly", "--data-root", str(h200_day_root), "--date", H200_DATE, "--engine", "dask",
               "--dask-config", str(missing), "--no-retrain"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--dask-config {missing}: no such file" in err, err
    assert not (h200_day_root / "classifier").exists()


def test_nightly_workers_below_zero_is_refused(
        h200_day_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--workers -2`` was clamped to 0 (every core) without a word, and the night ran."""
    rc = main(["nightly", "--data-root", str(h200_day_root), "--date", H200_DATE, "--workers", "-2",
               "--no-retrain"])
    assert rc == 2 and "argument --workers" in capsys.readouterr().err
    assert not (h200_day_root / "classifier").exists()


def test_calibrate_kernel_seconds_zero_is_refused_before_the_gpu(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gfile = tmp_path / "g.json"
    FileStateBackend.create(gfile, 1, simulate=True)
    out = tmp_path / "resp.json"
    rc = main(["calibrate", "--gpu", "0", "--backend", f"filestate:{gfile}", "--caps", "100,60",
               "--state-dir", str(tmp_path / "caps"), "--kernel-seconds", "0", "--out", str(out)])
    assert rc == 2 and "argument --kernel-seconds" in capsys.readouterr().err
    assert json.loads(gfile.read_text())["gpus"][0]["set_count"] == 0 and not out.exists()


# -- the sweep ----------------------------------------------------------------------------------------
def test_telemetry_run_period_below_poll_is_refused_before_the_data_root_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpus = tmp_path / "gpus.json"
    FileStateBackend.create(gpus, n=1)
    rc = main(["telemetry", "run", "--backend", f"filestate:{gpus}", "--data-root", str(tmp_path / "d"),
               "--host", "n1", "--period", "1", "--poll", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--period (1.0) must be >= --poll (2.0)" in err, err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(("option", "value"), [("--start", "nan"), ("--end", "inf"), ("--end", "1e999")])
def test_import_times_must_be_finite(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str,
                                     value: str) -> None:
    """``--start nan`` was a ValueError traceback; ``--end inf`` a range that never ends."""
    times = {"--start": "2026-11-29T00:00Z", "--end": "2026-11-29T01:00Z", option: value}
    rc = main(["telemetry", "import", "--prometheus", "http://127.0.0.1:9", "--start", times["--start"],
               "--end", times["--end"], "--data-root", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{option} {value!r}" in err and "not reachable" not in err, err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_install_hooks_refuses_a_slurm_timeout_that_times_out_every_squeue(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], timeout: str) -> None:
    """The Prolog's squeue then failed at once on every job: each job left uncapped, seen only in
    the hook log. The hooks' parser refuses it, so install-hooks does (plugin/install.py)."""
    rc = main(["plugin", "install-hooks", "--dest", str(tmp_path / "etc"), "--python", "/usr/bin/python3",
               "--hook-args", f"--backend nvml --slurm-timeout {timeout}"])
    err = capsys.readouterr().err
    assert rc == 2 and "--hook-args" in err and "argument --slurm-timeout" in err, err
    assert not (tmp_path / "etc").exists()


def _table(tmp_path: Path) -> Path:
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "alice", None, None, "memory", 0.95, 10, "rule")],
                      load_policy(POLICY).table_dict())
    return table


def test_explain_with_a_mistyped_data_root_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It answered "measured effect: none yet (no canary data)" for a root that does not exist."""
    args = ["policy", "explain", "--policy", str(POLICY), "--table", str(_table(tmp_path)), "--user", "alice",
            "--name", "x"]
    assert main(args) == 0
    capsys.readouterr()
    typo = tmp_path / "no-such-root"
    assert main([*args, "--data-root", str(typo)]) == 2
    assert f"--data-root {typo}: no such folder" in capsys.readouterr().err
    assert not typo.exists()


def test_explain_with_a_folder_for_the_table_names_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was an IsADirectoryError traceback."""
    rc = main(["policy", "explain", "--policy", str(POLICY), "--table", str(tmp_path), "--user", "a",
               "--name", "b"])
    err = capsys.readouterr().err
    assert rc == 3 and f"{tmp_path}: cannot read the label table" in err, err



@pytest.mark.parametrize("spec", ["radius:1.5", "radius:0", "radius:nan", "knn:2.5", "knn:0", "knn:inf"])
def test_model_train_checks_the_ambiguity_value_before_training(
        tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str], spec: str) -> None:
    """The range was checked by fit_ambiguity, after the whole training (knn:inf was an
    OverflowError traceback there); now while the options are read, naming --ambiguity."""
    out = tmp_path / "m"
    rc = main(["model", "train", "--telemetry", str(h200_telemetry), "--out", str(out), "--version", "t",
               "--ambiguity", spec])
    err = capsys.readouterr().err
    assert rc == 3 and f"--ambiguity {spec!r}: ambiguity" in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("option", ["--wal-dir", "--spool"])
def test_telemetry_run_refuses_a_file_where_a_folder_goes(
        tmp_path: Path, h200_raw: Path, capsys: pytest.CaptureFixture[str], option: str) -> None:
    """--wal-dir FILE was a FileExistsError traceback (exit 1) after the data root was made;
    --spool FILE was read as "no job files", every window then attributed from the GPU's process
    list without a word. (--data-root FILE: tests/test_telemetry_replay.py, "not writable".)"""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    paths = {"--data-root": str(tmp_path / "d"), "--wal-dir": str(tmp_path / "wal"),
             "--spool": str(tmp_path / "spool"), option: str(a_file)}
    rc = main(["telemetry", "run", "--backend", f"replay:{h200_raw}", "--once", "--host", "n1",
               *[w for kv in paths.items() for w in kv]])
    err = capsys.readouterr().err
    assert rc == 2 and f"{option} {a_file}" in err and "Traceback" not in err, err
    assert not (tmp_path / "d").exists() and not (tmp_path / "wal").exists()


def test_telemetry_import_refuses_a_file_as_data_root_before_asking_prometheus(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    rc = main(["telemetry", "import", "--prometheus", "http://127.0.0.1:9", "--start", "2026-11-29T00:00Z",
               "--end", "2026-11-29T01:00Z", "--data-root", str(a_file)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--data-root {a_file}" in err and "not reachable" not in err, err


@pytest.mark.parametrize("option", ["--log", "--state-dir", "--jobs-dir", "--gpu-map", "--slurm-bin",
                                    "--hpc-job-mapping-dir"])
def test_install_hooks_refuses_a_relative_path_in_the_hook_arguments(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str) -> None:
    """The wrappers run from / (deploy/slurm/prolog.sh: cd /), so '--log wattclass.log' had the
    hooks append to /wattclass.log and '--state-dir caps' keep the cap records in /caps."""
    rc = main(["plugin", "install-hooks", "--dest", str(tmp_path / "etc"), "--python", "/usr/bin/python3",
               "--hook-args", f"--backend nvml {option} wattclass/x"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{option} 'wattclass/x': give an absolute path" in err, err
    assert not (tmp_path / "etc").exists()
