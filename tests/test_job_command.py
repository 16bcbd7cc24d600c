"""`wattclass job JOBID`: one job at a glance from a data root (label store, job records, telemetry)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from wattclass.cli import main

DAY = "2026-11-29"


@pytest.fixture
def root(tmp_path: Path, h200_telemetry: Path) -> Path:
    r = tmp_path / "root"
    d = r / "telemetry" / f"date={DAY}" / "host=gpu-h200-03"
    d.mkdir(parents=True)
    shutil.copy(h200_telemetry, d / "gpu-h200-03-1.parquet")
    return r


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["job", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_job_from_telemetry_alone_uses_the_rule(root: Path, h200_telemetry: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    w = pd.read_parquet(h200_telemetry)
    j = w[w["job_id"] == "5003"]
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert d["label"] == "memory" and d["source"] == "rule" and d["confidence"] > 0.8
    assert d["energy_kwh"] == pytest.approx(j["energy_j"].sum() / 3.6e6, rel=1e-9)
    secs = (j["ts_end"] - j["ts_start"]).dt.total_seconds().sum()
    assert d["gpu_hours"] == pytest.approx(secs / 3600, rel=1e-9)
    assert d["mean_power_w_per_gpu"] == pytest.approx(j["energy_j"].sum() / secs, rel=1e-9)
    assert d["n_gpus"] == 1 and d["hosts"] == ["gpu-h200-03"] and d["user"] == j["user"].iloc[0]
    assert d["cap_w"] == 700 and d["decision"] == "none" and "Memory-bound" in d["hint"]


def test_cap_share_comes_from_the_gpu_model_not_a_guess(root: Path, h200_telemetry: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Without a % cap in the comment, the % is the limit over the model's default limit; on a
    model wattclass does not know it is not shown (it used to assume 700 W for every GPU)."""
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert d["cap_pct"] == pytest.approx(100.0)  # an H200 at its 700 W default
    f = next(root.rglob("*.parquet"))
    w = pd.read_parquet(f)
    w["gpu_model"] = "NVIDIA L40S"
    w.to_parquet(f)
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert d["cap_w"] == 700 and d["cap_pct"] is None
    w["gpu_model"] = "NVIDIA H200 NVL"  # a 600 W board: not guessed as the SXM's 700 W
    w.to_parquet(f)
    assert _json(capsys, "5003", "--data-root", str(root), "--date", DAY)["cap_pct"] is None
    w["gpu_model"] = "NVIDIA A100-SXM4-80GB"
    w["power_limit_w"] = 300.0
    w.to_parquet(f)
    assert _json(capsys, "5003", "--data-root", str(root), "--date", DAY)["cap_pct"] == pytest.approx(75.0)


def test_label_store_and_decision_win_and_narrow_the_scan(root: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    labels = root / "classifier" / "labels" / f"date={DAY}"
    labels.mkdir(parents=True)
    pd.DataFrame({"job_id": ["5003"], "user": ["chen"], "label": ["mixed"], "confidence": [0.71],
                  "source": ["model:v2"], "hosts": ["gpu-h200-03"], "inputs": ["nvml basic counters (model)"],
                  "start": [pd.Timestamp("2026-11-29T15:56:00Z")],
                  "end": [pd.Timestamp("2026-11-29T16:30:00Z")],
                  "account": ["physics"]}).to_parquet(labels / "labels.parquet")
    jobs = root / "jobs" / f"date={DAY}"
    jobs.mkdir(parents=True)
    pd.DataFrame({"job_id": ["5003"], "user": ["chen"], "account": ["physics"], "name": ["decode.sh"],
                  "admin_comment": ["wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"]}
                 ).to_parquet(jobs / "jobs.parquet")
    d = _json(capsys, "5003", "--data-root", str(root))
    assert (d["label"], d["confidence"], d["source"]) == ("mixed", 0.71, "model:v2")
    assert d["account"] == "physics" and d["name"] == "decode.sh"
    assert d["decision"] == "cap" and "cap 60% for memory" in d["reason"] and d["cap_pct"] == 60
    assert d["files_read"] == 1
    assert main(["job", "5003", "--data-root", str(root)]) == 0
    text = capsys.readouterr().out
    assert "Label: mixed   confidence 0.71   source model:v2" in text and "Hint: Mixed phases" in text


def test_unknown_job_and_bad_date_name_the_problem(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "999999", "--data-root", str(root)]) == 3
    assert "job 999999: not found" in capsys.readouterr().err
    assert main(["job", "5003", "--data-root", str(root), "--date", "29/11"]) == 2


def test_without_duckdb_the_same_answer(root: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    want = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    monkeypatch.setitem(sys.modules, "duckdb", None)  # DuckDB is only in the dev/bench extras
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got == want


def test_a_label_store_day_with_fewer_columns_does_not_hide_another_days_confidence(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Days of the label store differ in columns (older versions, the canary's generated history):
    the job's confidence must survive a first day that has no such column."""
    base = root / "classifier" / "labels"
    (base / "date=2026-11-01").mkdir(parents=True)
    pd.DataFrame({"job_id": ["1"], "label": ["memory"], "source": ["rule"]}).to_parquet(
        base / "date=2026-11-01" / "labels.parquet")
    (base / f"date={DAY}").mkdir(parents=True)
    pd.DataFrame({"job_id": ["5003"], "label": ["memory"], "confidence": [0.93], "source": ["rule"],
                  "hosts": ["gpu-h200-03"]}).to_parquet(base / f"date={DAY}" / "labels.parquet")
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert (d["label"], d["confidence"]) == ("memory", 0.93)


def test_job_on_telemetry_without_the_integer_pipe_column(root: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # review finding (issue 13 round 7): files written before a GPM column existed made DuckDB
    # fail on the column; now the pipe reads as not measured, and the rule leaves the job alone
    import pyarrow.parquet as pq

    for f in root.rglob("*.parquet"):
        pq.write_table(pq.read_table(f).drop_columns(["int_util_pct"]), f)
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert d["label"] is None and "compute pipe" in d["inputs"]
    assert d["energy_kwh"] > 0 and d["n_gpus"] == 1


def test_a_copied_file_and_impossible_rows_count_as_the_nightly_counts_them(
        root: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The job's energy and GPU-hours were the sum of every row read: a telemetry file copied under
    # another name doubled them, and one infinite energy made them inf (the nightly counts each
    # window once and leaves impossible rows out).
    want = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    part = root / "telemetry" / f"date={DAY}" / "host=gpu-h200-03"
    shutil.copy(part / "gpu-h200-03-1.parquet", part / "gpu-h200-03-1-copy.parquet")
    w = pd.read_parquet(h200_telemetry)
    bad = w[w["job_id"] == "5003"].head(2).copy()
    bad["ts_start"] += pd.Timedelta(seconds=1)  # not copies of kept windows: only the rules drop them
    bad["ts_end"] += pd.Timedelta(seconds=1)
    bad.loc[bad.index[0], "energy_j"] = float("inf")
    bad.loc[bad.index[1], "ts_end"] = bad["ts_start"].iloc[1] + pd.Timedelta(days=365)
    bad.to_parquet(part / "gpu-h200-03-2.parquet", index=False)
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got["energy_kwh"] == pytest.approx(want["energy_kwh"], rel=1e-12)
    assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], rel=1e-12)
    n = len(w[w["job_id"] == "5003"])
    assert got["windows_left_out"] == {"energy_j negative, NaN or infinite": 1,
                                       "window longer than 3600 s": 1, "duplicate windows": n}


def test_an_unreadable_file_of_the_day_is_skipped_not_a_traceback(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    want = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    part = root / "telemetry" / f"date={DAY}" / "host=gpu-h200-03"
    (part / "gpu-h200-03-2.parquet").write_bytes(b"PAR1 cut short")
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got["energy_kwh"] == want["energy_kwh"] and got["label"] == want["label"]


@pytest.mark.parametrize("column", ["ts_start", "energy_j"])
def test_a_file_whose_column_holds_text_does_not_break_the_sums(
        root: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str], column: str) -> None:
    # DuckDB then reads that column of every file as text: energy 'x' made the sum a traceback
    # (could not convert string to float), times as text broke the row rules
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    want = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    t = pq.read_table(h200_telemetry)
    t = t.filter(pc.equal(t["job_id"], "5003"))
    if column == "energy_j":
        t = t.set_column(t.column_names.index("energy_j"), "energy_j", pa.array(["x"] * t.num_rows))
        t = t.set_column(t.column_names.index("gpu_uuid"), "gpu_uuid", pa.array(["GPU-other"] * t.num_rows))
    else:
        for c in ("ts_start", "ts_end"):
            t = t.set_column(t.column_names.index(c), c, pc.cast(t[c], pa.string()))
    pq.write_table(t, root / "telemetry" / f"date={DAY}" / "host=gpu-h200-03" / "gpu-h200-03-2.parquet")
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got["energy_kwh"] == pytest.approx(want["energy_kwh"], rel=1e-12)
    left = {"energy_j": "energy_j negative, NaN or infinite", "ts_start": "duplicate windows"}[column]
    assert got["windows_left_out"] == {left: t.num_rows}


def test_a_torn_label_store_day_or_job_records_of_integer_ids_do_not_break_the_command(
        root: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    # each was a traceback: a torn labels.parquet of another day (ArrowInvalid), job records whose
    # ids are integers as a site's export writes them and JobsFileClient reads them
    # (ArrowNotImplementedError: no 'equal' for int64 and string), a torn jobs.parquet
    want = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    day = root / "classifier" / "labels" / "date=2026-11-28"
    day.mkdir(parents=True)
    (day / "labels.parquet").write_bytes(b"PAR1 torn")
    jobs = root / "jobs" / f"date={DAY}"
    jobs.mkdir(parents=True)
    pd.DataFrame({"job_id": [5003, 5004], "user": ["chen", "dana"], "account": ["phys", "bio"]}).to_parquet(
        jobs / "jobs.parquet")
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got["account"] == "phys" and got["energy_kwh"] == want["energy_kwh"]
    assert "skipping unreadable label store file" in caplog.text
    (jobs / "jobs.parquet").write_bytes(b"PAR1 torn")
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got["account"] is None and got["energy_kwh"] == want["energy_kwh"]
    assert "skipping unreadable job records" in caplog.text


def test_label_store_days_whose_columns_do_not_merge_are_read_one_by_one(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an older day with the confidence as text: pyarrow could not merge the days' schemas
    # (ArrowTypeError: large_string vs double), a traceback
    def day(date: str, label: str, conf: object) -> None:
        d = root / "classifier" / "labels" / f"date={date}"
        d.mkdir(parents=True)
        pd.DataFrame({"job_id": ["5003"], "label": [label], "confidence": [conf],
                      "source": ["model:v2"]}).to_parquet(d / "labels.parquet")

    day("2026-11-28", "idle", "0.5")
    day(DAY, "mixed", 0.71)
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert (d["label"], d["confidence"]) == ("mixed", 0.71)


def test_a_job_name_with_terminal_escapes_or_newlines_prints_as_one_plain_line(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job name, user and account are Slurm users' strings (sacct --json decodes \\u001b and \\n
    escapes): printed raw, ``wattclass job`` sent a user's ESC sequences to the administrator's
    terminal (set its title, clear the screen, OSC 52 writes the clipboard) and a newline forged
    output lines ("Decision: cap: ..."). Found by a fresh-eyes review of user strings in outputs."""
    jobs = root / "jobs" / f"date={DAY}"
    jobs.mkdir(parents=True)
    evil = "x\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\x9b31m\nDecision: cap: forged\r"
    pd.DataFrame({"job_id": ["5003"], "user": ["chen\x1b[8m"], "account": ["physics\n"],
                  "name": [evil]}).to_parquet(jobs / "jobs.parquet")
    assert main(["job", "5003", "--data-root", str(root), "--date", DAY]) == 0
    text = capsys.readouterr().out
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text), repr(text)
    decisions = [ln for ln in text.splitlines() if ln.startswith("Decision:")]
    assert len(decisions) == 1 and decisions[0].startswith("Decision: none: "), decisions
    assert "Name: x\\x1b]52;c;cm0gLXJmIH4K\\x07" in text
    # --json keeps the exact strings (a script gets the data; JSON escapes them)
    assert _json(capsys, "5003", "--data-root", str(root), "--date", DAY)["name"] == evil


def test_a_hidden_file_is_not_read_and_hosts_come_from_the_rows(
        root: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command read ``.name.parquet`` files, which the nightly never reads (it showed a job the
    nightly never saw), and DuckDB's hive partitioning replaced each row's host with its
    ``host=`` folder's name (a folder named otherwise, such as a copy's, was a node of the job)."""
    part = root / "telemetry" / f"date={DAY}" / "host=gpu-h200-03"
    w = pd.read_parquet(h200_telemetry)
    w.assign(job_id="777").to_parquet(part / ".gpu-h200-03-9.parquet", index=False)
    assert main(["job", "777", "--data-root", str(root), "--date", DAY]) == 3
    assert "job 777: not found" in capsys.readouterr().err
    moved = root / "telemetry" / f"date={DAY}" / "host=gpu-h200-03.old"
    part.rename(moved)
    d = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert d["hosts"] == ["gpu-h200-03"]


@pytest.mark.parametrize("duckdb", [True, False])
def test_windows_outside_their_files_day_are_left_out_as_the_nightly_leaves_them(
        root: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, duckdb: bool) -> None:
    """A clock step wrote windows a year ahead into the day's file: the nightly rejects them
    (``ts_start`` outside its date= partition's day) but the command summed their energy and
    GPU-hours into the job's, with DuckDB and without."""
    import sys

    from wattclass.classifier.validity import REJECT_DAY

    want = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    part = root / "telemetry" / f"date={DAY}" / "host=gpu-h200-03"
    w = pd.read_parquet(h200_telemetry)
    late = w[w["job_id"] == "5003"].copy()  # its 4 windows, again a year later
    late["ts_start"] += pd.Timedelta(days=365)
    late["ts_end"] += pd.Timedelta(days=365)
    late.to_parquet(part / "gpu-h200-03-2.parquet", index=False)
    if not duckdb:
        monkeypatch.setitem(sys.modules, "duckdb", None)
    got = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert got["energy_kwh"] == pytest.approx(want["energy_kwh"], rel=1e-12)
    assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], rel=1e-12)
    assert got["windows_left_out"] == {REJECT_DAY: len(late)}


def test_the_decision_comes_from_the_label_store_where_no_jobs_file_is_kept(
        root: Path, h200_telemetry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A site whose nightly reads sacct keeps no ``jobs/date=*/jobs.parquet``: `wattclass job` then
    said "none: no wattclass decision in the job's admin_comment ..." for a job job_submit.lua had
    decided and the Prolog capped (its windows at 420 W), the opposite of the truth. The nightly now
    keeps the wattclass token of each job's admin_comment in the label store, where `job` reads it;
    a job whose admin_comment is nowhere under the data root is not said to have no decision."""
    w = pd.read_parquet(h200_telemetry)
    user = str(w.loc[w["job_id"] == "5003", "user"].iloc[0])
    jobs = tmp_path / "sacct.csv"  # outside the data root, as sacct's records are
    pd.DataFrame({"job_id": ["5003"], "user": [user], "name": ["decode.sh"], "account": ["physics"],
                  "admin_comment": ["ops note wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=shadow;"
                                    "arm=capped"]}).to_csv(jobs, index=False, quoting=1)
    before = _json(capsys, "5003", "--data-root", str(root), "--date", DAY)
    assert before["decision"] == "none" and "sacct -j" in before["reason"], before
    assert main(["nightly", "--data-root", str(root), "--date", DAY, "--jobs-file", str(jobs),
                 "--no-retrain", "--table-out", str(tmp_path / "labels.tsv")]) == 0
    capsys.readouterr()
    d = _json(capsys, "5003", "--data-root", str(root))
    assert d["decision"] == "cap" and "cap 60% for memory" in d["reason"] and d["cap_pct"] == 60, d
    # a job whose record the nightly had, without a wattclass decision: none, said as none
    pd.DataFrame({"job_id": ["5003"], "user": [user], "name": ["decode.sh"], "account": ["physics"],
                  "admin_comment": ["ops note"]}).to_csv(jobs, index=False, quoting=1)
    assert main(["nightly", "--data-root", str(root), "--date", DAY, "--jobs-file", str(jobs),
                 "--no-retrain", "--table-out", str(tmp_path / "labels.tsv")]) == 0
    capsys.readouterr()
    d = _json(capsys, "5003", "--data-root", str(root))
    assert d["decision"] == "none" and "no wattclass decision" in d["reason"], d


def test_a_store_day_from_before_the_decision_column_does_not_say_no_decision(
        root: Path, h200_telemetry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A label store day written before ``decision_comment`` existed knows nothing of the job's
    decision. Read beside a newer day (the union of the days' columns gives the old row a null
    ``decision_comment``), its job with a user was said "none: no wattclass decision in the job's
    admin_comment", though job_submit.lua had decided it (found by the session review). Such a row
    says the decision is not known here, as a store without the column does."""
    w = pd.read_parquet(h200_telemetry)
    user = str(w.loc[w["job_id"] == "5003", "user"].iloc[0])
    jobs = tmp_path / "sacct.csv"
    pd.DataFrame({"job_id": ["5003"], "user": [user], "name": ["decode.sh"], "account": ["physics"],
                  "admin_comment": ["wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=shadow"]}
                 ).to_csv(jobs, index=False, quoting=1)
    assert main(["nightly", "--data-root", str(root), "--date", DAY, "--jobs-file", str(jobs),
                 "--no-retrain", "--table-out", str(tmp_path / "labels.tsv")]) == 0
    capsys.readouterr()
    day = root / "classifier" / "labels" / f"date={DAY}" / "labels.parquet"
    stored = pd.read_parquet(day)
    newer = root / "classifier" / "labels" / "date=2026-11-30" / "labels.parquet"
    newer.parent.mkdir(parents=True)
    stored.assign(job_id="9" + stored["job_id"].astype(str), date="2026-11-30").to_parquet(newer, index=False)
    stored.drop(columns=["decision_comment"]).to_parquet(day, index=False)  # as the version before wrote it
    d = _json(capsys, "5003", "--data-root", str(root))
    assert d["decision"] == "none" and "sacct -j" in d["reason"], d
    assert "no wattclass decision" not in d["reason"], d
