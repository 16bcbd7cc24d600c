"""The jobs-file client builds its records column by column (issue 15): the same records, problems
and frame as the former row-by-row build, on odd inputs too, and clear errors naming the job."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattclass.errors import DataError
from wattclass.jobrecord import JobRecord
from wattclass.slurm import client as C

EVER = (dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC))


def _str(value: object) -> str | None:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def _int(value: object) -> int | None:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else int(value)  # type: ignore[call-overload]


def _row_by_row(path: Path) -> tuple[list[JobRecord], list[str]]:
    """The former build: one dict per row, one ``_ts``/``_str``/``_int`` call per value."""
    import io

    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        text = path.read_bytes().decode("utf-8", "surrogateescape").translate(C._MARK_BAD)
        df = pd.read_csv(io.StringIO(text), dtype={"job_id": str})
    if "gpus" in df.columns:
        gpus = pd.to_numeric(df["gpus"], errors="coerce")
        df["gpus"] = gpus.astype(object).where(gpus.notna(), None)
    for col in ("start", "end"):
        if col in df.columns and pd.api.types.is_numeric_dtype(df[col]):
            df[col] = pd.to_datetime(df[col], unit="s", utc=True)
    recs, problems = [], []
    for row in df.to_dict("records"):
        rec = JobRecord(job_id=str(row["job_id"]), name=_str(row.get("name")), user=_str(row.get("user")),
                        account=_str(row.get("account")), partition=_str(row.get("partition")),
                        start=C._ts(row.get("start")), end=C._ts(row.get("end")),
                        admin_comment=_str(row.get("admin_comment")), gpus=_int(row.get("gpus")))
        bad = [f for f in ("job_id", "user", "account", "partition", "name", "admin_comment")
               if not C._utf8(getattr(rec, f))]
        shown = "".join("?" if not C._utf8(c) else c for c in rec.job_id)[:32]
        if not bad:
            recs.append(rec)
        elif set(bad) <= {"name", "admin_comment"}:
            problems.append(f"job {shown}: {' and '.join(bad)} not UTF-8, dropped")
            recs.append(rec._replace(name=None if "name" in bad else rec.name,
                                     admin_comment=None if "admin_comment" in bad else rec.admin_comment))
        else:
            problems.append(f"job {shown}: {', '.join(bad)} not UTF-8, record skipped")
    return recs, problems


def _same(path: Path) -> C.JobsFileClient:
    client = C.JobsFileClient(path)
    want, problems = _row_by_row(path)
    got = client.jobs(*EVER)
    assert got == want
    # equal datetimes may still differ in their tzinfo objects: compare what they print too
    assert [tuple(map(repr, r)) for r in got] == [tuple(map(repr, r)) for r in want]
    assert client.problems == problems
    pd.testing.assert_frame_equal(client.jobs_frame(*EVER),
                                  pd.DataFrame(want, columns=list(C.JOB_COLUMNS)))
    return client


def test_csv_with_iso_times_offsets_blanks_and_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_bytes(b"job_id,name,user,account,partition,start,end,admin_comment,gpus\n"
                  b"1,n\xff,u,a,p,2026-11-29T01:00:00,2026-11-29T02:00:00+02:00,,3\n"
                  b"2,ok,u\xfe,a,p,,2026-11-29 03:00,x,\n"
                  b"3,,,,,2026-11-29T01:00:00.1234567Z,,c,1.0\n"
                  b"4\xfd,x,u,a,p,,,,\n")
    client = _same(f)
    assert [r.job_id for r in client.jobs(*EVER)] == ["1", "3"]
    assert client.problems == ["job 1: name not UTF-8, dropped", "job 2: user not UTF-8, record skipped",
                               "job 4?: job_id not UTF-8, record skipped"]
    assert client.jobs(*EVER)[1].start == dt.datetime(2026, 11, 29, 1, 0, 0, 123456, tzinfo=dt.UTC)


def test_csv_with_epoch_seconds_and_missing_columns(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text("job_id,start,end,gpus\n7,1796014788,1796014799.5,2\n8,1796014788,,\n")
    recs = _same(f).jobs(*EVER)
    assert recs[0].end == dt.datetime.fromtimestamp(1796014799.5, dt.UTC)
    assert (recs[1].end, recs[1].name, recs[1].gpus) == (None, None, None)
    only_ids = tmp_path / "ids.csv"
    only_ids.write_text("job_id\n9\n")
    assert _same(only_ids).jobs(*EVER) == [JobRecord("9", None, None, None, None, None, None)]


def test_parquet_with_naive_zoned_and_nanosecond_times(tmp_path: Path) -> None:
    f = tmp_path / "jobs.parquet"
    pd.DataFrame({
        "job_id": [1, 2, 3],
        "name": ["a", None, "\U000F0081"],  # a code point the client reserves for bytes not UTF-8
        "start": pd.to_datetime(["2026-11-29 01:00", "NaT", "2026-11-29 02:00:00.000001234"], format="mixed"),
        "end": pd.to_datetime(["2026-11-29 01:00+05:00", "2026-11-29 02:00+05:00", None],
                              utc=True).tz_convert("Europe/Berlin"),
        "gpus": [1.0, np.nan, 4.0],
    }).to_parquet(f)
    recs = _same(f).jobs(*EVER)
    assert recs[0].start == dt.datetime(2026, 11, 29, 1, tzinfo=dt.UTC)  # naive reads as UTC
    assert recs[0].end == dt.datetime(2026, 11, 28, 20, tzinfo=dt.UTC)
    assert recs[2].start == dt.datetime(2026, 11, 29, 2, 0, 0, 1, tzinfo=dt.UTC)  # floored to us
    assert (recs[1].start, recs[2].end, recs[2].name, recs[1].gpus) == (None, None, None, None)


def test_the_fleet_generators_jobs_file(tmp_path: Path) -> None:
    """What ``wattclass fleet generate`` writes (and the nightly bench reads): Parquet timestamps in
    ms, num_gpus (not gpus), no admin comment."""
    f = tmp_path / "jobs.parquet"
    t0 = pd.Timestamp("2026-11-29", tz="UTC")
    pd.DataFrame({"job_id": [f"25240{i:05d}" for i in range(50)], "name": [f"job{i}" for i in range(50)],
                  "user": [f"u{i % 7}" for i in range(50)], "account": "proj", "partition": "gpu",
                  "start": [t0 + pd.Timedelta(minutes=i) for i in range(50)],
                  "end": [None if i % 5 == 0 else t0 + pd.Timedelta(hours=i) for i in range(50)],
                  "num_gpus": np.arange(50, dtype=np.int32)}).astype(
        {"start": "datetime64[ms, UTC]", "end": "datetime64[ms, UTC]"}).to_parquet(f)
    assert len(_same(f).jobs(*EVER)) == 50


def test_a_time_that_is_not_one_names_the_file_the_job_and_the_column(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text("job_id,start\n7,2026-11-29T01:00:00\n8,yesterday-ish\n")
    with pytest.raises(DataError, match=r"jobs.csv: job 8: start 'yesterday-ish' is not a time"):
        C.JobsFileClient(f)


def test_text_stays_text_and_sacct_no_time_words_are_null(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text("job_id,name,user,account,partition,start,end,gpus\n"
                 "00123,null,NA,0042,gpu,2026-11-29T01:00:00,Unknown,2\n"
                 "124,nan,u,,gpu,N/A,None,\n")
    a, b = C.JobsFileClient(f).jobs(*EVER)
    assert (a.job_id, a.name, a.user, a.account, a.end, a.gpus) == ("00123", "null", "NA", "0042", None, 2)
    assert (b.name, b.account, b.start, b.end, b.gpus) == ("nan", None, None, None, None)


@pytest.mark.parametrize(("column", "value", "why"), [
    ("start", "1796014788000", r"start '1796014788000' is not a time in epoch seconds \(milliseconds\?\)"),
    ("end", "1e20", r"end '1e\+20' is not a time in epoch seconds"),
    ("start", "true", r"start 'True' is not a time"),
    ("gpus", "inf", r"gpus 'inf' is not a GPU count"),
    ("gpus", "-1", r"gpus '-1' is not a GPU count"),
    ("gpus", "1.5", r"gpus '1.5' is not a GPU count"),
    ("gpus", "lots", r"gpus 'lots' is not a number"),
])
def test_a_number_that_cannot_be_what_its_column_says_names_the_job(
        tmp_path: Path, column: str, value: str, why: str) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text(f"job_id,{column}\n42,{value}\n")
    with pytest.raises(DataError, match=rf"jobs.csv: job 42: {why}"):
        C.JobsFileClient(f)


def test_parquet_ids_with_nulls_bytes_and_array_task_ids(tmp_path: Path) -> None:
    f = tmp_path / "jobs.parquet"
    pd.DataFrame({"job_id": pd.array([12345, None, 12347], dtype="Int64").astype("float64"),
                  "name": [b"ok", None, b"n\xff"], "slurm_job_id": ["900", None, "902"]}).to_parquet(f)
    client = C.JobsFileClient(f)
    recs = client.jobs(*EVER)
    got = [(r.job_id, r.name, r.slurm_job_id) for r in recs]
    assert got == [("12345", "ok", "900"), ("12347", None, "902")]  # a name not UTF-8: dropped
    assert client.problems == ["row 2: no job_id, record skipped", "job 12347: name not UTF-8, dropped"]


def test_a_list_where_text_belongs_names_the_job(tmp_path: Path) -> None:
    f = tmp_path / "jobs.parquet"
    pd.DataFrame({"job_id": ["7"], "account": [[1, 2]]}).to_parquet(f)
    with pytest.raises(DataError, match=r"jobs.parquet: job 7: account .* is not text"):
        C.JobsFileClient(f)


def test_an_error_shows_bytes_that_are_not_utf8_as_question_marks(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_bytes(b"job_id,start\n7\xff" + b"x" * 100 + b",soon\n")
    with pytest.raises(DataError) as err:
        C.JobsFileClient(f)
    msg = str(err.value)
    assert "job 7?" in msg and "x" * 32 not in msg and chr(C._BAD_BASE + 0xFF) not in msg


def test_spreadsheet_and_sacct_words_for_missing_are_null(tmp_path: Path) -> None:
    f = tmp_path / "jobs.csv"
    f.write_text("job_id,start,end,gpus\n1,2026-11-29T01:00:00,#N/A,#N/A\n2,<NA>,n/a,<NA>\n3,unknown,UNKNOWN,n/a\n")
    assert [(r.start is None, r.end, r.gpus) for r in C.JobsFileClient(f).jobs(*EVER)] == [
        (False, None, None), (True, None, None), (True, None, None)]


def test_parquet_with_pandas_nullable_columns(tmp_path: Path) -> None:
    f = tmp_path / "jobs.parquet"
    pd.DataFrame({"job_id": pd.array([5, 6], dtype="Int64"), "name": pd.array(["a", None], dtype="string"),
                  "gpus": pd.array([2, None], dtype="Int64")}).to_parquet(f)
    recs = C.JobsFileClient(f).jobs(*EVER)
    assert [(r.job_id, r.name, r.gpus) for r in recs] == [("5", "a", 2), ("6", None, None)]


def test_a_carriage_return_in_a_field_neither_splits_nor_shifts_the_row(tmp_path: Path) -> None:
    """A user and a job name holding a bare CR, unquoted (as pandas' to_csv writes it) and quoted: each
    row stays one record with its own columns (pandas used to end the row at the CR: 2 rows read
    as 4 records, job 5001 with user "a" and a record "b" in the job_id column)."""
    f = tmp_path / "jobs.csv"
    f.write_bytes(b"job_id,name,user,account\n5001,train,a\rb,ml\n5002,\"x\ry\",c,ml\r\n5003,n,d,ml\n")
    client = C.JobsFileClient(f)
    recs = client.jobs(*EVER)
    assert [(r.job_id, r.name, r.user, r.account) for r in recs] == [
        ("5001", "train", "a\rb", "ml"), ("5002", "x\ry", "c", "ml"), ("5003", "n", "d", "ml")]
    assert client.problems == []


def test_a_row_with_more_or_fewer_fields_than_the_header_refuses_the_file_naming_the_rows(
        tmp_path: Path) -> None:
    """A row that does not have the header's field count is never read into the wrong columns
    (too few used to fill the last columns with null silently; too many failed with pandas' own
    message), and a line break inside quotes is data."""
    f = tmp_path / "jobs.csv"
    f.write_text("job_id,name,user,account\n1,a,u,ml\n2,b,u\n3,c,u,ml,extra\n4,\"two\nlines\",u,ml\n5,e,u,ml\n")
    with pytest.raises(DataError) as exc:
        C.JobsFileClient(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}: cannot read jobs file: row 2 (line 3, job 2): 3 fields, the header has 4; "
                          "row 3 (line 4, job 3): 5 fields, the header has 4: a line break or the delimiter")
    quoted = tmp_path / "quoted.csv"
    quoted.write_text("job_id,name,user,account\n4,\"two\nlines\",u,ml\n5,\"e,f\",u,ml\n")
    assert [(r.job_id, r.name) for r in C.JobsFileClient(quoted).jobs(*EVER)] == [("4", "two\nlines"),
                                                                                   ("5", "e,f")]
    no_id = tmp_path / "noid.csv"
    no_id.write_text("job_id,name\n,a\n7,d\n")
    c2 = C.JobsFileClient(no_id)
    assert [r.job_id for r in c2.jobs(*EVER)] == ["7"] and c2.problems == ["row 1: no job_id, record skipped"]


def test_a_job_name_cannot_forge_a_record_in_an_unquoted_export(tmp_path: Path) -> None:
    """Review finding: in an unquoted export (``sacct -P --delimiter=,``) a job name holding a line
    break and a whole row's worth of fields added a record of its own making (job 9999 given to
    alice beside bob's real record for it), while only the broken first part was skipped."""
    f = tmp_path / "jobs.csv"
    forged = "x\n9999,y,alice,physics"
    f.write_text(f"job_id,name,user,account\n9999,train,bob,ml\n1234,{forged},mallory,ml\n")
    with pytest.raises(DataError, match="forged rows; not read"):
        C.JobsFileClient(f)


def test_a_job_id_with_records_of_two_users_refuses_the_file(tmp_path: Path) -> None:
    """A job name can fill every line of an unquoted export to the header's field count, and so
    forge a record that no field count reveals: job 9999 given to alice beside bob's own record
    (and its own job's record given to a user of its choosing). A job keeps its user over
    requeues, so two users for one id refuse the file; two runs of one user's job do not."""
    f = tmp_path / "jobs.csv"
    name = "x,alice,ml\n9999,y,alice,physics\n7777,z"
    f.write_text(f"job_id,name,user,account\n9999,train,bob,ml\n1234,{name},mallory,ml\n")
    with pytest.raises(DataError, match=r"jobs.csv: job 9999 has records of two users \(bob and alice\)"):
        C.JobsFileClient(f)
    requeued = tmp_path / "requeued.csv"
    requeued.write_text("job_id,name,user,account\n9999,train,bob,ml\n9999,train,bob,ml\n9999,train,,ml\n")
    assert [r.user for r in C.JobsFileClient(requeued).jobs(*EVER)] == ["bob", "bob", None]



def test_a_jobs_file_with_misnamed_columns_is_named_not_silently_empty(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A site's own export with sacct's column names (``JobID``, ``User``, ...): the error said
    only "missing column job_id", and with ``job_id`` right but ``User``/``JobName`` the file was
    read with every user and name empty, silently: that night added no user keys to the table.
    Now the error lists the columns a jobs file has, and a missing user/name/account/start/end
    column is a WARNING naming it and the columns that were not read."""
    sacct = tmp_path / "sacct.csv"
    sacct.write_text('"JobID","User"\n"1","alice"\n')
    with pytest.raises(DataError) as err:
        C.JobsFileClient(sacct)
    assert "job_id" in str(err.value) and "user" in str(err.value) and "JobID" in str(err.value)
    mixed = tmp_path / "mixed.csv"
    mixed.write_text('"job_id","User","JobName","account","partition","start","end"\n'
                     '"1","alice","train","a","p","2026-12-01T00:00:00Z","2026-12-01T01:00:00Z"\n')
    with caplog.at_level("WARNING"):
        recs = C.JobsFileClient(mixed).jobs(*EVER)
    assert recs[0].user is None  # optional columns stay optional
    text = caplog.text
    assert str(mixed) in text and "user" in text and "name" in text and "User" in text and "JobName" in text
    caplog.clear()
    good = tmp_path / "good.csv"
    good.write_text('"job_id","user","name","account","partition","start","end","num_gpus"\n'
                    '"1","alice","train","a","p","2026-12-01T00:00:00Z","2026-12-01T01:00:00Z","2"\n')
    with caplog.at_level("WARNING"):
        C.JobsFileClient(good)
    assert caplog.text == ""  # an extra column alone is no misspelling
