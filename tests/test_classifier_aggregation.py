"""The length-weighted job aggregation (issue 13, round 2): a job-boundary stub counts for its
length in the compute/memory split, the idle share stays the rule's window count, and the
nightly engine labels exactly as the model's own job_predictions do."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from wattclass.classifier import model as M
from wattclass.classifier import rules
from wattclass.classifier.engine import label_files_local
from wattclass.classifier.reader import telemetry_files
from wattclass.classifier.replay import materialize
from wattclass.classifier.training import training_set

DATA = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"


def test_window_weights_are_the_share_of_a_full_window() -> None:
    w = M.window_weights([10.0, 25.0, 2.5, 0.0, np.nan])
    assert w.tolist() == pytest.approx([1.0, 1.0, 0.25, M.MIN_WINDOW_WEIGHT, 1.0])


def test_a_short_stub_no_longer_makes_a_job_mixed() -> None:
    # one full memory window and a 1.5 s compute stub at the job's end
    one = np.array([1.0])
    lab_counts, _ = M.job_from_counts([0.0], one, one, [1.8])
    lab_w, conf_w = M.job_from_counts([0.0], one, one, [1.8], weights=M.LengthWeights([0.0], [0.15], [1.0]))
    assert lab_counts[0] == rules.J_MIXED and lab_w[0] == rules.J_MEMORY
    # two full windows that disagree stay mixed: only length counts, not the argmax
    lab2, _ = M.job_from_counts([0.0], one, one, [1.8], weights=M.LengthWeights([0.0], [1.0], [1.0]))
    assert lab2[0] == rules.J_MIXED
    # a stub carries less evidence than a full window: lower confidence than two full memory windows
    _, conf_full = M.job_from_counts([0.0], [0.0], [2.0], [1.8], weights=M.LengthWeights([0.0], [0.0], [2.0]))
    assert 0 < conf_w[0] < conf_full[0]


def test_the_idle_share_stays_the_window_count() -> None:
    # one idle full window + one short active window: half the windows are active -> not idle (rule),
    # although by length the job was mostly idle
    lab, _ = M.job_from_counts([1.0], [0.0], [1.0], [1.9], weights=M.LengthWeights([1.0], [0.0], [0.2]))
    assert lab[0] == rules.J_MEMORY
    # two idle windows + one long active window: idle by count, whatever the active window's length
    lab, _ = M.job_from_counts([2.0], [0.0], [1.0], [2.9], weights=M.LengthWeights([2.0], [0.0], [1.0]))
    assert lab[0] == rules.J_IDLE


def test_job_predictions_without_lengths_are_the_plain_counts() -> None:
    proba = np.array([[0.1, 0.2, 0.7], [0.1, 0.6, 0.3], [0.9, 0.05, 0.05]])
    group = np.array(["a", "a", "b"], dtype=object)
    k1, l1, c1 = M.job_predictions(proba, group)
    k2, l2, c2 = M.job_predictions(proba, group, [10.0, np.nan, 10.0])  # full or unknown: whole
    assert (k1 == k2).all() and (l1 == l2).all() and np.allclose(c1, c2)
    _, l3, _ = M.job_predictions(proba, group, [10.0, 1.0, 10.0])  # the compute window is a stub
    assert l1[0] == rules.J_MIXED and l3[0] == rules.J_MEMORY


def test_unknown_aggregation_is_refused() -> None:
    ts = M.TrainingSet(np.zeros((2, len(M.FEATURES)), np.float32), np.array([1, 2], np.int8),
                       np.array(["a", "b"], dtype=object))
    with pytest.raises(M.DataError, match="unknown job aggregation 'soft'"):
        M.aggregation_durations(ts, "soft")
    with pytest.raises(M.DataError, match="unknown job aggregation 'soft'"):
        M.train_model(ts, "t", evaluate=False, aggregation="soft")


@pytest.fixture(scope="module")
def ridge_files() -> object:
    with tempfile.TemporaryDirectory(prefix="wattclass-agg-") as tmp:
        roots = materialize([DATA / "ridge"], Path(tmp))
        yield telemetry_files(roots), training_set([DATA / "ridge"], max_windows_per_job=0)


@pytest.mark.parametrize("aggregation", ["length-weighted", "counts"])
def test_nightly_engine_labels_as_the_models_job_predictions(ridge_files, aggregation: str,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path) -> None:
    files, ts = ridge_files
    sub = ts.subset(np.char.startswith(ts.group.astype(str), "ridge:90"))  # one GPU's 40 jobs: quick
    model = M.train_model(sub, "t-agg", n_folds=3, kind=M.KIND_MARGIN, aggregation=aggregation)
    model.save(tmp_path / "m")
    model = M.load_model(tmp_path / "m")
    assert model.aggregation == aggregation
    keys, lab, raw = model.job_predictions(ts.X, ts.group, ts.dur)
    want = {str(k).split(":", 1)[1]: (rules.JOB_LABELS[p], c)
            for k, p, c in zip(keys, lab, model.calibrate(raw, lab), strict=True)}
    got = label_files_local(files, model, source="model", workers=1).labels
    got = got[got["job_id"].isin(list(want))]
    assert len(got) == len(want) == 81
    for _, row in got.iterrows():  # the label store keeps 4 decimals of confidence
        label, conf = want[row["job_id"]]
        assert row["label"] == label and row["confidence"] == pytest.approx(conf, abs=6e-5), row["job_id"]
    # the aggregation matters on these runs: some job's label differs between the two
    _, lab_other, _ = M.job_predictions(model.predict_proba(ts.X), ts.group,
                                        None if aggregation == "length-weighted" else ts.dur)
    assert (lab_other != lab).any()


def test_training_side_confidences_are_the_nightlys_on_a_real_folder(tmp_path: Path) -> None:
    """One window set feeds training and serving: the shipped model's job labels and confidences
    (calibrated, and after its ambiguity check) from the training-side windows of ``fresh6``
    (``training_set``, as CV, calibration and the bench scripts score jobs) equal the engine's.
    The replay has three boundary windows of 0.08 s holding a poll's second: while the nightly
    rejected them (over MAX_GPU_POWER_W over their length) and training kept them, those three
    jobs differed by up to 0.021; both keep them now (validity.ENERGY_SPAN_FLOOR_S)."""
    from wattclass.classifier.ambiguity import job_fingerprints

    model = M.load_model(M.default_model_dir())
    assert model.ambiguity is not None and model.evidence_cap is not None
    ts = training_set([DATA / "fresh6"], max_windows_per_job=0)
    keys, lab, raw = model.job_predictions(ts.X, ts.group, ts.dur)
    fkeys, fp = job_fingerprints(ts.X, ts.group, ts.dur)
    assert (fkeys == keys).all()
    calibrated = model.calibrate(raw, lab)
    checked = model.job_confidence(raw, lab, fp)
    want = {str(k).split(":", 1)[1]: (rules.JOB_LABELS[p], c, u)
            for k, p, c, u in zip(keys, lab, checked, calibrated, strict=True)}
    got = label_files_local(telemetry_files(materialize([DATA / "fresh6"], tmp_path)), model,
                            source="model", workers=1).labels
    assert len(got) == len(want) == 85
    for _, row in got.iterrows():  # the label store keeps 4 decimals of confidence
        label, conf, unchecked = want[row["job_id"]]
        assert row["label"] == label, row["job_id"]
        assert row["confidence"] == pytest.approx(conf, abs=6e-5), row["job_id"]
        assert row["confidence_unchecked"] == pytest.approx(unchecked, abs=6e-5), row["job_id"]


@pytest.mark.parametrize("split_files", [False, True])
def test_engine_confidences_in_mixed_mode_and_across_files_match_the_model(tmp_path: Path,
                                                                           split_files: bool) -> None:
    """Issue 13 round 10's cap holds the job's length, so the engine must sum every class's window
    weights: in ``auto`` mode half the windows lose GPM (the rule labels the rest, counted whole),
    and (``split_files``) every file is split in two so each job's sums merge across partials. The
    model-labelled jobs must get the confidence ``job_predictions`` gives on the same windows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from wattclass.classifier.features import feature_matrix, window_features
    from wattclass.classifier.training import window_rule_codes

    model = M.load_model(M.default_model_dir())
    assert model.evidence_cap is not None
    rng = np.random.default_rng(1)
    files = list(telemetry_files(materialize([DATA / "long-families"], tmp_path)))
    groups, probas, durs, written = [], [], [], []
    for f in files:
        t = pq.read_table(f)
        sm = t.column("sm_util_pct")
        gone = pa.array(rng.random(t.num_rows) < 0.5)
        t = t.set_column(t.column_names.index("sm_util_pct"), "sm_util_pct",
                         pc.if_else(gone, pa.scalar(None, sm.type), sm))
        rows = np.arange(t.num_rows)
        parts = [(f, t.take(rows[rows % 2 == 0])), (f.with_name("b" + f.name), t.take(rows[rows % 2 == 1]))] \
            if split_files else [(f, t)]
        for path, part in parts:
            pq.write_table(part, path)
            written.append(path)
        codes = window_rule_codes(t)
        gpm = codes >= 0
        proba = model.predict_proba(feature_matrix(window_features(t)))
        onehot = np.zeros_like(proba)
        onehot[np.flatnonzero(gpm), codes[gpm]] = 1.0
        job = np.asarray(t.column("job_id").to_numpy(zero_copy_only=False), dtype=object)
        ok = np.asarray([j is not None for j in job])
        groups.append(job[ok].astype(str))
        probas.append(np.where(gpm[:, None], onehot, proba)[ok])
        ms = pc.subtract(pc.cast(t.column("ts_end"), pa.int64()), pc.cast(t.column("ts_start"), pa.int64()))
        dur = ms.to_numpy() / (1e6 if t.schema.field("ts_start").type.unit == "us" else 1e3)  # seconds
        durs.append(np.where(gpm, np.nan, dur)[ok])  # the rule's windows count whole
    keys, lab, raw = M.job_predictions(np.concatenate(probas), np.concatenate(groups).astype(object),
                                       np.concatenate(durs), model.evidence_cap)
    want = dict(zip(keys, zip(lab, model.calibrate(raw, lab), strict=True), strict=True))
    got = label_files_local(sorted(written), model, source="auto", workers=1,
                            **({"chunk_files": 1} if split_files else {})).labels
    by_model = got[~got["source"].str.startswith("rule")]
    assert len(by_model) >= 10
    for _, row in by_model.iterrows():
        label, conf = want[row["job_id"]]
        assert row["label"] == rules.JOB_LABELS[label], row["job_id"]
        assert row["confidence_unchecked"] == pytest.approx(conf, abs=6e-5), row["job_id"]


def test_a_model_file_of_an_unknown_aggregation_is_refused(tmp_path: Path) -> None:
    """Its calibration belongs to job decisions this wattclass would not make: applying it with
    counts would label with the wrong confidence, silently."""
    import json
    import shutil

    from wattclass.errors import DataError

    shutil.copytree(M.default_model_dir(), tmp_path / "m")
    meta_path = tmp_path / "m" / "model.json"
    meta = json.loads(meta_path.read_text())
    for known in (M.AGG_COUNTS, M.AGG_LENGTH, M.AGG_COUNTS_OLD):
        meta["aggregation"] = known
        meta_path.write_text(json.dumps(meta))
        assert M.load_model(tmp_path / "m").aggregation in M.AGGREGATIONS
    meta["aggregation"] = "duration-weighted posterior mean (a newer wattclass)"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="unknown job aggregation"):
        M.load_model(tmp_path / "m")


def test_the_evidence_cap_stops_confidence_growing_with_length_not_the_label() -> None:
    # issue 13 round 10: one job's windows repeat one job's error, so a 30-window job must not be
    # surer than the cap says; its label (the shares) stays
    long = dict(n_idle=[0.0], n_compute=[1.0], n_memory=[29.0], sum_pmax=[27.0],
                weights=M.LengthWeights([0.0], [1.0], [29.0]))
    lab_free, conf_free = M.job_from_counts(**long)  # type: ignore[arg-type]
    lab_cap, conf_cap = M.job_from_counts(**long, evidence_cap=1.1)  # type: ignore[arg-type]
    assert lab_free.tolist() == lab_cap.tolist() == [rules.J_MEMORY]
    assert conf_cap[0] < conf_free[0]
    # as sure as the same shares (and mean top probability 0.9) over 1.1 windows: the cap scales
    # the counts, keeping the shares
    _, conf_short = M.job_from_counts([0.0], [1.1 / 30], [1.1 * 29 / 30], [0.99],
                                      weights=M.LengthWeights([0.0], [1.1 / 30], [1.1 * 29 / 30]))
    assert conf_cap[0] == pytest.approx(conf_short[0])
    # a job within the cap is untouched
    one_window = M.LengthWeights([0.0], [0.0], [1.0])
    _, c1 = M.job_from_counts([0.0], [0.0], [1.0], [0.9], weights=one_window, evidence_cap=1.1)
    _, c2 = M.job_from_counts([0.0], [0.0], [1.0], [0.9], weights=one_window)
    assert c1.tolist() == c2.tolist()


def test_the_evidence_cap_is_a_quantile_of_the_training_jobs_length_in_windows() -> None:
    group = np.asarray(["a", "a", "b", "c", "c", "c"], dtype=object)
    dur = [10.0, 5.0, 10.0, 10.0, 10.0, 10.0]  # a: 1.5 windows, b: 1, c: 3
    assert M.job_evidence(group, dur).tolist() == [1.5, 1.0, 3.0]
    want = np.quantile([1.0, 1.5, 3.0], M.EVIDENCE_QUANTILE)
    assert M.evidence_cap_for(group, dur) == pytest.approx(want)
    assert M.job_evidence(group, None).tolist() == [2.0, 1.0, 3.0]  # plain counts without lengths
    # a few long jobs among many short ones do not lift it to their length
    many = np.asarray([f"s{i}" for i in range(95)] + [f"l{i // 30}" for i in range(150)], dtype=object)
    assert M.evidence_cap_for(many, [10.0] * 245) == 1.0


def test_the_cap_holds_the_jobs_length_idle_windows_included() -> None:
    # a 10 s idle window and a 3 s memory stub: 1.3 windows long. The posterior sees the idle count
    # scaled by the active windows' mean weight (0.3 + 0.3 = 0.6), but the cap is held against the
    # length, the quantity it is a quantile of (job_evidence): 1.3 is at the cap, untouched
    proba = np.array([[0.9, 0.05, 0.05], [0.1, 0.1, 0.8]])
    group = np.asarray(["j", "j"], dtype=object)
    dur = [10.0, 3.0]
    assert M.job_evidence(group, dur).tolist() == pytest.approx([1.3])
    _, _, free = M.job_predictions(proba, group, dur)
    _, _, at = M.job_predictions(proba, group, dur, evidence_cap=1.3)
    _, _, below = M.job_predictions(proba, group, dur, evidence_cap=0.65)
    assert at.tolist() == free.tolist() and below[0] != free[0]
    # the engine's sums give the same: w_idle + w_compute + w_memory is the length
    _, e = M.job_from_counts([1.0], [0.0], [1.0], [1.7], weights=M.LengthWeights([1.0], [0.0], [0.3]),
                             evidence_cap=0.65)
    assert e.tolist() == pytest.approx(below.tolist())


def test_the_length_weights_come_as_one_triple_or_not_at_all() -> None:
    """One contract for job_from_counts: the idle weights are part of the job's length, which the
    cap is held against, so compute and memory weights without them (the cap then held against the
    posterior's own counts, a path only direct calls took) cannot be passed."""
    counts = ([1.0], [0.0], [1.0], [1.7])
    with pytest.raises(TypeError):
        M.job_from_counts(*counts, w_compute=[0.0], w_memory=[0.3], evidence_cap=0.65)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        M.job_from_counts(*counts, [0.0], [0.3])  # type: ignore[misc]
    with pytest.raises(TypeError):
        M.LengthWeights([0.0], [0.3])  # type: ignore[call-arg]
    # without weights the length is the plain window count (job_evidence's without lengths)
    _, plain = M.job_from_counts(*counts, evidence_cap=1.0)
    _, as_one = M.job_from_counts(*counts, weights=M.LengthWeights([1.0], [0.0], [1.0]), evidence_cap=1.0)
    assert plain.tolist() == pytest.approx(as_one.tolist())


def test_train_model_carries_the_cap_its_calibration_was_fitted_with(ridge_files,  # type: ignore[no-untyped-def]
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _, ts = ridge_files
    fixed = M.train_model(ts, "t", n_folds=3, evidence_cap=2.5)
    assert fixed.evidence_cap == 2.5 and fixed.meta["format_version"] == M.FORMAT_EVIDENCE_CAP
    monkeypatch.setattr(M, "DEFAULT_CAP_EVIDENCE", False)  # as eval scripts do for earlier recipes
    off = M.train_model(ts, "t", n_folds=3)
    assert off.evidence_cap is None and "evidence_cap_windows" not in off.meta
    assert off.meta["format_version"] == M.format_version_for(off.kind) < M.FORMAT_EVIDENCE_CAP


@pytest.mark.parametrize("cap", [0, -1.0, "2", True, float("inf")])
def test_a_bad_evidence_cap_in_a_model_file_is_refused(tmp_path: Path, cap: object) -> None:
    import json
    import shutil

    shutil.copytree(M.default_model_dir(), tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["evidence_cap_windows"] = cap
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(M.DataError, match="evidence_cap_windows' must be a positive number"):
        M.load_model(tmp_path / "m")
    meta["evidence_cap_windows"], meta["format_version"] = 1.1, M.FORMAT_AMBIGUITY
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(M.DataError, match="'evidence_cap_windows' in a format 3 file"):
        M.load_model(tmp_path / "m")
