"""The nightly's speed paths (issue 15) give the results of the plain ones.

Folds fitted side by side, the final fit beside the cross-validation, the cached base training
set, LightGBM without scikit-learn, and the imports the scan leaves out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from wattclass.classifier import model as M
from wattclass.classifier import training as T

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "wattclass/data/h200/telemetry.parquet"


@pytest.fixture(scope="module")
def dev_set() -> M.TrainingSet:
    return T.training_set([DEV])


def _same_cv(a: dict[str, object], b: dict[str, object]) -> None:
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


@pytest.mark.parametrize("kind", M.MODEL_KINDS)
def test_folds_fitted_side_by_side_give_the_cross_validation_of_folds_in_turn(
        dev_set: M.TrainingSet, kind: str) -> None:
    one = M.cross_validate(dev_set, n_folds=5, seed=3, kind=kind, workers=1)
    four = M.cross_validate(dev_set, n_folds=5, seed=3, kind=kind, workers=4)
    _same_cv(one, four)
    assert len(set(one["jobs"]["fold"])) == 5  # type: ignore[index]


def test_final_fit_beside_the_cross_validation_writes_the_model_of_fits_in_turn(
        dev_set: M.TrainingSet, tmp_path: Path) -> None:
    together = M.train_model(dev_set, "v", created="x", workers=2)
    cv = M.cross_validate(dev_set, workers=1)
    alone = M.train_model(dev_set, "v", created="x", evaluate=False)
    assert together.booster.model_to_string() == alone.booster.model_to_string()
    assert together.meta["calibration"] == cv["calibration"]
    assert together.meta["metrics"]["accuracy"] == cv["accuracy"]


def test_a_failing_fold_fails_the_cross_validation() -> None:
    def boom() -> None:
        raise RuntimeError("fold 3")

    with pytest.raises(RuntimeError, match="fold 3"):
        M.run_parallel([lambda: None, boom, lambda: None], workers=2)


def test_base_training_set_is_cached_and_equals_a_fresh_build(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "day.parquet").write_bytes(DEV.read_bytes())
    cache = tmp_path / "cache"
    fresh = T.training_set([src], max_windows_per_job=16)
    first = T.cached_training_set([src], 16, cache)
    assert len(list(cache.glob("base-training-*.npz"))) == 1

    calls = []
    real = T.training_set

    def counted(*a: object, **k: object) -> M.TrainingSet:
        calls.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(T, "training_set", counted)
    second = T.cached_training_set([src], 16, cache)
    assert calls == []  # read from the cache
    for ts in (first, second):
        assert ts.X.dtype == fresh.X.dtype and ts.X.tobytes() == fresh.X.tobytes()
        assert ts.y.tobytes() == fresh.y.tobytes()
        assert ts.group.dtype == object and list(ts.group) == list(fresh.group)
        assert fresh.dur is not None and ts.dur is not None
        np.testing.assert_array_equal(ts.dur, fresh.dur)
        assert fresh.margin is not None and ts.margin is not None
        np.testing.assert_array_equal(ts.margin, fresh.margin)
        assert ts.sources == fresh.sources
    # another cap per job, or changed source bytes: another key, rebuilt
    T.cached_training_set([src], 8, cache)
    assert len(calls) == 1
    (src / "notes.txt").write_text("a new file in the source")
    T.cached_training_set([src], 16, cache)
    assert len(calls) == 2
    (src / "notes.txt").write_text("the same file, other bytes")
    T.cached_training_set([src], 16, cache)
    assert len(calls) == 3
    T.cached_training_set([src], 16, cache)
    assert len(calls) == 3


def test_unreadable_base_training_cache_is_rebuilt(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "day.parquet").write_bytes(DEV.read_bytes())
    cache = tmp_path / "cache"
    T.cached_training_set([src], 16, cache)
    (path,) = cache.glob("base-training-*.npz")
    good = path.read_bytes()
    for bad in (b"not an npz", good[: len(good) // 2]):  # a truncated zip raises BadZipFile
        path.write_bytes(bad)
        ts = T.cached_training_set([src], 16, cache)
        assert len(ts) == len(T.training_set([src], max_windows_per_job=16))
        with np.load(path, allow_pickle=False) as z:  # replaced by a good one
            assert len(z["y"]) == len(ts)
    # a file of an earlier key is removed when the current one is written
    stale = cache / "base-training-0123456789abcdef0123456789abcdef.npz"
    stale.write_bytes(good)
    path.unlink()
    T.cached_training_set([src], 16, cache)
    assert sorted(p.name for p in cache.iterdir()) == [path.name]


@pytest.mark.parametrize("where", ["file_writable_by_others", "folder_writable_by_others", "symlink",
                                   "owned_by_nobody"])
def test_an_untrusted_base_training_cache_is_neither_read_nor_written(tmp_path: Path, where: str) -> None:
    """The nightly runs as root and trains on these windows: a planted cache must not steer it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "day.parquet").write_bytes(DEV.read_bytes())
    cache = tmp_path / "cache"
    T.cached_training_set([src], 16, cache)
    (path,) = cache.glob("base-training-*.npz")
    want = T.training_set([src], max_windows_per_job=16)
    # plant a cache with the right key but other windows (the key is computable from public files)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["y"] = np.zeros_like(arrays["y"])
    planted = tmp_path / "planted.npz"
    np.savez(planted, **arrays)
    if where == "symlink":
        path.unlink()
        path.symlink_to(planted)
    else:
        path.write_bytes(planted.read_bytes())
        if where == "file_writable_by_others":
            path.chmod(0o666)
        elif where == "folder_writable_by_others":
            cache.chmod(0o777)
        else:
            os.chown(path, 65534, 65534)
    before = path.read_bytes()
    ts = T.cached_training_set([src], 16, cache)
    assert np.array_equal(ts.y, want.y) and not np.array_equal(ts.y, arrays["y"])
    assert path.read_bytes() == before  # not rewritten through an untrusted path either


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_training_and_loading_do_not_import_scikit_learn() -> None:
    got = _run(
        "import json, sys\n"
        "from pathlib import Path\n"
        "from wattclass.classifier import model as M\n"
        "from wattclass.classifier.training import training_set\n"
        f"ts = training_set([Path({str(DEV)!r})])\n"
        "m = M.train_model(ts, 'v', created='x')\n"
        "p = M.load_model(M.default_model_dir()).predict_proba(ts.X)\n"
        "import lightgbm\n"
        "print(json.dumps({'sklearn': 'sklearn' in sys.modules, 'rows': len(p),\n"
        "                  'acc': m.meta['metrics']['accuracy'],\n"
        "                  'blocked_left': sys.modules.get('sklearn', 0) is None}))\n")
    assert got["sklearn"] is False and got["blocked_left"] is False
    assert got["rows"] and float(got["acc"]) >= 0.85  # type: ignore[arg-type]


def test_lightgbm_with_its_scikit_learn_api_after_the_light_import() -> None:
    got = _run(
        "import json, sys\n"
        "from wattclass.classifier import lgbload\n"
        "light = lgbload.core()\n"
        "before = light.compat.SKLEARN_INSTALLED\n"
        "full = lgbload.full()\n"
        "print(json.dumps({'before': before, 'after': full.compat.SKLEARN_INSTALLED,\n"
        "                  'dask_api': hasattr(full, 'DaskLGBMClassifier'),\n"
        "                  'same_after': lgbload.core() is full}))\n")
    assert got == {"before": False, "after": True, "dask_api": True, "same_after": True}


def test_threads_importing_lightgbm_at_once_all_get_the_whole_module() -> None:
    got = _run(
        "import json, threading\n"
        "from wattclass.classifier import lgbload\n"
        "seen = []\n"
        "def grab():\n"
        "    seen.append(hasattr(lgbload.core(), 'Dataset'))\n"
        "ts = [threading.Thread(target=grab) for _ in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(json.dumps({'seen': seen}))\n")
    assert got == {"seen": [True] * 8}


def test_the_scan_imports_neither_pandas_nor_scipy_nor_lightgbm() -> None:
    got = _run(
        "import json, sys\n"
        "import wattclass.classifier.engine, wattclass.classifier.scan, wattclass.classifier.rules\n"
        "import wattclass.classifier.margin, wattclass.classifier.features\n"
        "print(json.dumps({m: m in sys.modules for m in ('pandas', 'scipy', 'lightgbm', 'sklearn')}))\n")
    assert got == {"pandas": False, "scipy": False, "lightgbm": False, "sklearn": False}


def test_preloading_a_missing_module_is_harmless() -> None:
    from wattclass.classifier.engine import preload_after_scan

    th = preload_after_scan(("wattclass_no_such_module_xyz", "json"))
    assert isinstance(th, threading.Thread)
    th.join(timeout=30)
    assert not th.is_alive()
    # in a fresh interpreter: a module nothing imported before is loaded after the failing one
    got = _run("import json, sys\n"
               "from wattclass.classifier.engine import preload_after_scan\n"
               "before = 'wave' in sys.modules\n"
               "preload_after_scan(('wattclass_no_such_module_xyz', 'wave')).join(30)\n"
               "print(json.dumps({'before': before, 'after': 'wave' in sys.modules}))\n")
    assert got == {"before": False, "after": True}


def test_scanner_calls_on_scan_once_after_binding() -> None:
    from wattclass.classifier.reader import telemetry_files
    from wattclass.classifier.scan import Scanner

    seen: list[int] = []
    sc = Scanner(1, on_scan=lambda: seen.append(1))
    try:
        files = telemetry_files([DEV])
        sc.partials(files)
        sc.partials(files)
        assert seen == [1]
    finally:
        sc.close()
    import duckdb

    with pytest.raises(duckdb.Error):  # the binder's error: nothing ran, so no on_scan
        s2 = Scanner(1, on_scan=lambda: seen.append(2))
        try:
            s2._execute("SELECT no_such_column FROM range(1)")
        finally:
            s2.close()
    assert seen == [1]


@pytest.mark.parametrize("path", [
    "/d/telemetry/date=2026-11-29/host=a/x.parquet", "date=2026-11-29/host=a/x.parquet",
    "/date=2026-11-29/h/x", "/d/date=2026-11-29/date=2026-11-30/x", "/d/date=2026-13-01/h/x",
    "/d/date=2026-11-29/a/b/x", "/d/date=2026-11-29/x", "/d/h/x", "x", "/d/date=2026-11-29x/h/x"])
def test_partition_day_from_the_path_text_equals_the_parsed_parts(path: str) -> None:
    import datetime as dt

    from wattclass.classifier.rowsql import partition_day_ms

    want = None
    for part in reversed(Path(path).parts[:-1]):  # the innermost date= folder, parsed
        if part.startswith("date="):
            try:
                day = dt.date.fromisoformat(part[5:])
            except ValueError:
                break
            want = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()) * 1000
            break
    assert partition_day_ms(Path(path)) == partition_day_ms(path) == want


@pytest.mark.parametrize("string_type", ["string", "large_string"])
def test_hosts_per_job_in_arrow_equal_the_sorted_python_join(string_type: str) -> None:
    import pandas as pd
    import pyarrow as pa

    from wattclass.classifier.engine import _hosts

    rng = np.random.default_rng(0)
    pairs = {(f"j{j}", f"h{h:03d}" if h % 3 else f"Hé{h}") for j, h in rng.integers(0, 40, (300, 2))}
    jobs, hosts = zip(*sorted(pairs), strict=True)
    typ = getattr(pa, string_type)()
    order = pa.array(rng.permutation(len(jobs)))
    t = pa.table({"job_id": pa.array(jobs, typ), "host": pa.array(hosts, typ)}).take(order)
    want = pd.DataFrame({"job_id": jobs, "host": hosts}).groupby("job_id")["host"].agg(
        lambda s: ",".join(sorted(set(s))))
    got = _hosts(t).reindex(want.index)
    assert got.tolist() == want.tolist()


def test_retraining_sample_comes_in_job_and_hash_order(tmp_path: Path) -> None:
    """DuckDB returns the pass's groups in any order; the sample (and so the retrained model,
    whose bagging depends on row order) must not."""
    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.reader import telemetry_files

    files = telemetry_files([DEV])
    a = label_files_local(files, None, "auto", sample_per_job=4, sample_prefix="d", workers=2)
    b = label_files_local(list(reversed(files)), None, "auto", sample_per_job=4, sample_prefix="d", workers=1)
    assert len(a.sample) > 0
    assert list(a.sample.group) == sorted(a.sample.group)
    assert a.sample.X.tobytes() == b.sample.X.tobytes() and list(a.sample.group) == list(b.sample.group)


def test_one_blas_thread_while_training_and_the_limit_restored_after_overlapping_uses() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads() -> list[int]:
        return [int(i["num_threads"]) for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    if not before:
        pytest.skip("no BLAS library loaded")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        start = blas_threads()
        first, second = M._OneBlasThread(), M._OneBlasThread()
        first.__enter__()
        assert set(blas_threads()) == {1}
        second.__enter__()  # another training, entered while the first runs (another thread)
        first.__exit__(None, None, None)  # ... and the first ends before it: still one thread
        assert set(blas_threads()) == {1}
        second.__exit__(None, None, None)
        assert blas_threads() == start
    assert blas_threads() == before


def test_nightly_model_loader_loads_once_and_stops_after_close() -> None:
    from wattclass.classifier.nightly import _Once

    calls: list[int] = []

    def load() -> M.WindowModel:
        calls.append(1)
        return object()  # type: ignore[return-value]

    once = _Once(load)
    threads = [threading.Thread(target=once) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and once() is once()
    late = _Once(load)
    late.close()
    with pytest.raises(RuntimeError):
        late()
    assert calls == [1]


def test_a_failed_model_load_is_not_retried_by_the_background_thread() -> None:
    """The run ends on a failed load and lets go of its lock; a retry from the preload thread
    could then write the registry unlocked."""
    from wattclass.classifier.nightly import _Once

    calls: list[int] = []

    def load() -> M.WindowModel:
        calls.append(1)
        raise OSError("registry unreadable")

    once = _Once(load)
    for _ in range(3):
        with pytest.raises(OSError, match="registry unreadable"):
            once()
    assert calls == [1]


def test_parallel_fits_stop_starting_after_the_first_error() -> None:
    started: list[int] = []
    gate = threading.Event()

    def fail() -> None:
        started.append(0)
        raise ValueError("fold 0 failed")

    def slow(i: int) -> None:
        started.append(i)
        gate.wait(1)

    tasks = [fail, *[(lambda i=i: slow(i)) for i in range(1, 12)]]
    with pytest.raises(ValueError, match="fold 0 failed"):
        try:
            M.run_parallel(tasks, workers=2)
        finally:
            gate.set()
    assert len(started) < len(tasks)  # the queued ones were cancelled
