"""The canary effect estimator recovers injected effects; the nightly stores it; `effects` prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from wattclass.classifier.canary_history import DEFAULT_TRUTH, generate_history
from wattclass.classifier.effects import EFFECT_COLUMNS, canary_jobs, effects_from_history, estimate_effects
from wattclass.classifier.store import ClassifierStore
from wattclass.cli import main

SEEDS = 40


def _covers(row: pd.Series, truth: tuple[float, float]) -> tuple[bool, bool]:
    return (row["runtime_ratio_lo"] <= truth[0] <= row["runtime_ratio_hi"],
            row["energy_ratio_lo"] <= truth[1] <= row["energy_ratio_hi"])


def test_intervals_cover_the_injected_effects_in_at_least_90_percent_of_seeds() -> None:
    hits: dict[tuple[str, str], list[bool]] = {}
    for seed in range(SEEDS):
        eff = effects_from_history(generate_history(seed=seed), seed=seed)
        assert set(zip(eff["label"], eff["cap"], strict=True)) == set(DEFAULT_TRUTH)
        for _, r in eff.iterrows():
            rt, en = _covers(r, DEFAULT_TRUTH[(r["label"], r["cap"])])
            hits.setdefault((r["label"], "runtime"), []).append(rt)
            hits.setdefault((r["label"], "energy"), []).append(en)
    coverage = {k: sum(v) / len(v) for k, v in hits.items()}
    assert all(c >= 0.9 for c in coverage.values()), coverage


def test_point_estimates_are_close_and_intervals_narrow_as_jobs_accrue() -> None:
    widths = []
    for jobs_per_key in (4, 12, 40):
        eff = effects_from_history(generate_history(jobs_per_key=jobs_per_key, seed=3), seed=3)
        mem = eff[(eff["label"] == "memory") & (eff["cap"] == "60%")].iloc[0]
        assert mem["energy_ratio"] == pytest.approx(0.75, abs=0.03)
        assert mem["runtime_ratio"] == pytest.approx(1.02, abs=0.03)
        widths.append(mem["energy_ratio_hi"] - mem["energy_ratio_lo"])
    assert widths[0] > widths[1] > widths[2], widths


def test_coverage_logic_rejects_a_biased_estimate() -> None:
    """The coverage check can fail: a shifted truth is outside most intervals."""
    for seed in range(5):
        eff = effects_from_history(generate_history(seed=seed), seed=seed)
        comp = eff[eff["label"] == "compute"].iloc[0]
        assert _covers(comp, (1.20, 0.80)) == (False, False)
        if _covers(comp, (1.08, 0.93)) != (True, True):
            continue
        break
    else:
        pytest.fail("the truth was outside the interval in 5 seeds in a row")


def test_keys_with_one_arm_carry_no_contrast_and_few_keys_give_no_interval() -> None:
    h = generate_history(keys_per_effect=2, jobs_per_key=6, seed=0)
    eff = effects_from_history(h)
    assert (eff["n_keys"] <= 2).all()
    assert eff["runtime_ratio_lo"].isna().all()  # fewer than MIN_KEYS: no interval claimed
    only_capped = h.assign(arm="capped")
    e2 = estimate_effects(canary_jobs(only_capped))
    assert (e2["n_keys"] == 0).all() and e2["runtime_ratio"].isna().all()


def test_jobs_without_arm_or_runtime_are_ignored() -> None:
    h = generate_history(seed=0)
    noise = h.head(50).assign(arm=None)
    bad = h.head(5).assign(slurm_end=h.head(5)["slurm_start"], end=h.head(5)["start"],
                           job_id=lambda d: d["job_id"] + "x")
    jobs = canary_jobs(pd.concat([h, noise.assign(job_id=lambda d: d["job_id"] + "n"), bad]))
    assert len(jobs) == len(h)


def test_effects_command_reads_the_stored_night_and_recomputes(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = ClassifierStore(tmp_path)
    h = generate_history(seed=5)
    for date, day in h.groupby("date"):
        store.write_labels(str(date), day.drop(columns=["date"]))
    assert main(["effects", "--data-root", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [tuple(sorted(r)) for r in rows] == [tuple(sorted(EFFECT_COLUMNS))] * 2
    stored = effects_from_history(store.label_history()).assign(runtime_ratio=9.0)
    store.write_effects("2026-11-30", stored)
    assert main(["effects", "--data-root", str(tmp_path), "--json"]) == 0
    assert {r["runtime_ratio"] for r in json.loads(capsys.readouterr().out)} == {9.0}
    assert main(["effects", "--data-root", str(tmp_path), "--recompute"]) == 0
    out = capsys.readouterr().out
    assert "memory" in out and "60%" in out and "estimated now" in out
    assert main(["effects", "--data-root", str(tmp_path / "nothing")]) == 2  # a typo: usage error
    assert "nothing" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["effects", "--data-root", str(tmp_path / "empty")]) == 3
    assert "no classifier store" in capsys.readouterr().err


def test_label_store_gets_the_arm_from_admin_comment() -> None:
    import datetime as dt

    from wattclass.classifier.nightly import _join_slurm, _records
    from wattclass.jobrecord import JobRecord

    class Jobs:
        def jobs_frame(self, start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
            t = dt.datetime(2026, 11, 28, 1, tzinfo=dt.UTC)
            return pd.DataFrame([
                JobRecord("1", "a.sh", "u", "acc", "gpu", t, t,
                          "ops wattclass:label=memory;conf=0.90;cap=60%;src=rule;mode=shadow;arm=capped"),
                JobRecord("2", "a.sh", "u", "acc", "gpu", t, t, None)])

    labels = pd.DataFrame({"job_id": ["1", "2"], "user": ["u", "u"]})
    out = _join_slurm(labels, _records(Jobs(), "2026-11-28"))  # type: ignore[arg-type]
    assert out.loc[0, ["decision_label", "cap", "arm"]].tolist() == ["memory", "60%", "capped"]
    assert out.loc[1, ["decision_label", "cap", "arm"]].isna().all()


def test_policy_explain_cites_the_measured_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from wattclass.labeltable import TableEntry, write_label_table
    from wattclass.policy import parse_policy

    store = ClassifierStore(tmp_path / "d")
    store.write_effects("2026-11-30", effects_from_history(generate_history(seed=2), seed=2))
    pol = tmp_path / "p.toml"
    pol.write_text('mode = "shadow"\n[caps]\nmemory = "60%"\n[canary]\nfraction = 0.1\n')
    table = tmp_path / "labels.lua"
    write_label_table(table, [TableEntry("user", "ann", None, None, "memory", 0.95, 3, "rule")],
                      parse_policy({"caps": {"memory": "60%"}}).table_dict())
    argv = ["policy", "explain", "--policy", str(pol), "--table", str(table), "--user", "ann", "--name", "x"]
    assert main([*argv, "--data-root", str(tmp_path / "d"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["measured_effect"]["label"] == "memory" and d["measured_effect"]["cap"] == "60%"
    assert d["measured_effect"]["energy_ratio"] == pytest.approx(0.75, abs=0.03)
    assert d["admin_comment"].endswith(("arm=capped", "arm=control"))
    assert main([*argv, "--data-root", str(tmp_path / "d")]) == 0
    text = capsys.readouterr().out
    assert "measured on this cluster" in text and "canary arm:" in text
    assert main(argv) == 0 and "measured" not in capsys.readouterr().out


def test_a_job_across_midnight_counts_the_energy_and_span_of_both_nights() -> None:
    """The label store has one row per job per night (that night's windows only): a canary job that
    ran 23:00-00:20 has a row of 3,000 J (23:00-24:00) and one of 1,000 J (00:00-00:20). Its
    energy is 4,000 J and its span 80 min; keeping the newest row alone counted 1,000 J and 20 min."""
    rows = [
        {"job_id": "7", "date": "2026-11-20", "user": "u", "name": "a.sh", "decision_label": "memory",
         "cap": "60%", "arm": "capped", "energy_j": 3000.0, "slurm_start": None, "slurm_end": None,
         "start": pd.Timestamp("2026-11-20T23:00Z"), "end": pd.Timestamp("2026-11-21T00:00Z")},
        {"job_id": "7", "date": "2026-11-21", "user": "u", "name": "a.sh", "decision_label": "memory",
         "cap": "60%", "arm": "capped", "energy_j": 1000.0, "slurm_start": None, "slurm_end": None,
         "start": pd.Timestamp("2026-11-21T00:00Z"), "end": pd.Timestamp("2026-11-21T00:20Z")},
    ]
    jobs = canary_jobs(pd.DataFrame(rows))
    assert len(jobs) == 1
    assert jobs.loc[0, "energy_j"] == pytest.approx(4000.0)
    assert jobs.loc[0, "runtime_s"] == pytest.approx(80 * 60.0)
    # a night whose Slurm records were unavailable (no arm that night) still holds the job's energy
    no_arm = [rows[0] | {"arm": None, "cap": None, "decision_label": None}, rows[1]]
    assert canary_jobs(pd.DataFrame(no_arm)).loc[0, "energy_j"] == pytest.approx(4000.0)
    no_arm_later = [rows[0], rows[1] | {"arm": None, "cap": None, "decision_label": None}]
    assert canary_jobs(pd.DataFrame(no_arm_later)).loc[0, "energy_j"] == pytest.approx(4000.0)
