"""The report's structure (one function + one template per section) and the sections issue 11 added:
per-user / per-account tables, --policy caps, the aggregated view at fleet size, and the polish
list (no pandas artefacts, no float noise, one format for confidences, legends that match)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattclass.cli import main
from wattclass.report import sections
from wattclass.report.build import render_report
from wattclass.report.estimates import estimate_savings, rule_job_labels, window_saved_j
from wattclass.report.render import conf, kwh, num

TEMPLATES = Path(sections.__file__).parent / "templates" / "sections"


@pytest.fixture
def windows(h200_telemetry: Path) -> pd.DataFrame:
    return pd.read_parquet(h200_telemetry)


def test_every_section_function_has_its_template_and_every_template_a_function() -> None:
    names = {fn.__name__ for fn in sections.SECTIONS}
    files = {p.name.removesuffix(".html.j2") for p in TEMPLATES.glob("*.html.j2")}
    assert names == files


def test_number_formats_hide_float_noise_and_keep_confidence_to_two_digits() -> None:
    assert num(1e-19) == "0" and kwh(1e-19) == "0 Wh" and kwh(-3e-17) == "0 Wh"
    assert num(2.2e-9) == "<0.001" and num(0.0123) == "0.0123"
    assert num(12345.6) == "12,346" and num(3.14159) == "3.14"
    assert num(np.int64(58)) == "58" and num(7) == "7" and num(np.float32(2.5)) == "2.50"
    assert [conf(v) for v in (0.9, 0.923, 1, None, "x")] == ["0.90", "0.92", "1.00", "-", "-"]


def _tables(page: str) -> list[str]:
    return re.findall(r"<table>.*?</table>", page, flags=re.S)


def test_tables_have_no_pandas_artefacts(windows: pd.DataFrame) -> None:
    labels = rule_job_labels(windows)
    decisions = pd.DataFrame({"label": ["memory", "compute"], "status": ["shadow", "none"],
                              "reason": ["shadow", "low_confidence"], "cap": ["60%", None]})
    page = render_report(windows, labels, None, decisions)
    assert "col_0" not in page and "Unnamed" not in page
    # Counts print as integers (the decisions crosstab, the jobs columns).
    dec = page.split("<h2>Policy decisions</h2>")[1].split("<h2>")[0]
    assert "<td>1</td>" in dec and ".00</td>" not in dec
    users = page.split("<h3>Per user</h3>")[1].split("</table>")[0]
    assert not re.search(r"<tr><td>[^<]+</td><td>\d+\.\d+</td>", users)  # the jobs column
    for t in _tables(page):
        head = re.search(r"<thead>(.*?)</thead>", t, flags=re.S)
        assert head is not None and head.group(1).count("<tr>") == 1  # one header row, no index-name row
        assert "<th></th>" not in t
        assert not re.search(r"<tr>\s*</tr>", t)
        assert not re.search(r"\de-\d", t)  # no 1e-19
    # Every confidence cell in the top-jobs table has exactly two decimals.
    top = page.split("Jobs that used the most energy")[1]
    confs = re.findall(r"<td>(0\.\d+|1\.\d+)</td><td>rule</td>", top)
    assert confs and all(len(c.split(".")[1]) == 2 for c in confs)


def test_per_user_and_account_tables_add_up(windows: pd.DataFrame) -> None:
    labels = rule_job_labels(windows)
    jobs = sorted(labels["job_id"])
    labels["account"] = ["physics" if i % 2 else "chem" for i in range(len(labels))]
    page = render_report(windows, labels)
    assert "Energy per user and per account" in page and "<h3>Per account</h3>" in page
    sec = page.split("Energy per user and per account")[1].split("<h2>")[0]
    for acct in ("physics", "chem"):
        assert f"<td>{acct}</td>" in sec
    for user in windows.loc[windows["job_id"].isin(jobs), "user"].dropna().unique():
        assert f"<td>{user}</td>" in sec
    # The per-window saving sums to the per-label estimate the savings section prints.
    w = windows.copy()
    w["label"] = w["job_id"].map(labels.set_index("job_id")["label"]).fillna("no job")
    assert window_saved_j(w).sum() / 3.6e6 == pytest.approx(estimate_savings(w).saved_kwh, rel=1e-9)
    assert estimate_savings(w).saved_kwh > 0


def test_policy_caps_drive_the_savings_and_are_named(windows: pd.DataFrame, tmp_path: Path,
                                                     h200_telemetry: Path) -> None:
    pol = tmp_path / "policy.toml"
    pol.write_text('mode = "enforce"\n[caps]\nmemory = "100%"\nidle = "100%"\n')
    root = tmp_path / "root" / "telemetry" / "date=2026-11-29" / "host=h"
    root.mkdir(parents=True)
    pd.read_parquet(h200_telemetry).to_parquet(root / "p.parquet")
    out = tmp_path / "r.html"
    root_arg = ["--data-root", str(tmp_path / "root")]
    assert main(["report", *root_arg, "--out", str(out), "--policy", str(pol)]) == 0
    page = out.read_text()
    assert f"from the policy {pol} (enforce mode)" in page
    dec = page.split("<h2>Policy decisions</h2>")[1].split("<h2>")[0]
    assert "not available" not in dec and "<td>memory</td><td>100%</td>" in dec
    assert "Result: <b>0 Wh</b>" in page  # 100% caps save nothing
    out2 = tmp_path / "r2.html"
    assert main(["report", "--data-root", str(tmp_path / "root"), "--out", str(out2)]) == 0
    assert "the example policy, deploy/policy.example.toml" in out2.read_text()
    assert "<h3>Per account</h3>" not in out2.read_text()
    # Slurm job records of the day (the fleet generator's layout) give the per-account table.
    jobs = tmp_path / "root" / "jobs" / "date=2026-11-29"
    jobs.mkdir(parents=True)
    ids = sorted(pd.read_parquet(h200_telemetry)["job_id"].dropna().unique())
    pd.DataFrame({"job_id": ids, "account": ["astro" if int(j) % 2 else "bio" for j in ids]}).to_parquet(
        jobs / "jobs.parquet")
    assert main(["report", *root_arg, "--out", str(out2)]) == 0
    acct = out2.read_text().split("<h3>Per account</h3>")[1].split("</table>")[0]
    assert "<td>astro</td>" in acct and "<td>bio</td>" in acct
    assert "Result: <b>0 Wh</b>" not in out2.read_text()
    assert main(["report", "--data-root", str(tmp_path / "root"), "--out", str(out2),
                 "--policy", str(tmp_path / "nope.toml")]) == 2


def test_many_gpus_get_the_fleet_view_not_one_strip_each(windows: pd.DataFrame) -> None:
    copies = []
    for i in range(40):
        c = windows.copy()
        c["host"] = f"node{i:03d}"
        c["gpu_uuid"] = c["gpu_uuid"] + f"-{i}"
        c["job_id"] = c["job_id"].where(c["job_id"].isna(), c["job_id"].astype(str) + f"{i:03d}")
        copies.append(c)
    big = pd.concat(copies, ignore_index=True)
    page = render_report(big, max_gpus=16)
    assert "Fleet power over time, by label" in page and "40 GPUs" in page
    assert "Power per GPU over time" not in page
    n_rows = page.split("<h3>Per user</h3>")[1].split("</table>")[0].count("<tr>") - 1
    assert n_rows <= 16  # top 15 + one "others" row at most
    assert np.isfinite(big["energy_j"].sum())


def test_the_fleet_plot_draws_every_bins_energy_the_last_one_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fleet view's area is its energy: a "post" step draws each value from its x to the next,
    # and with one x per bin the last bin (on the UTC clock since a626139, often a full one) was
    # not drawn at all.
    from matplotlib.axes import Axes

    from wattclass.report import plots

    drawn: list[tuple[np.ndarray, tuple[np.ndarray, ...]]] = []
    real = Axes.stackplot

    def spy(self: Axes, x: np.ndarray, *ys: np.ndarray, **kw: object) -> object:
        drawn.append((np.asarray(x), ys))
        return real(self, x, *ys, **kw)

    monkeypatch.setattr(Axes, "stackplot", spy)
    fleet = pd.DataFrame({"bin": [0, 1, 2, 2], "label": ["compute", "idle", "compute", "memory"],
                          "energy_j": [3.0e6, 1.5e6, 6.0e6, 3.0e6]})
    plots.fleet_power(fleet, pd.Timestamp("2026-11-29 15:30", tz="UTC"), 1800.0)
    x, ys = drawn[0]
    x_s = (x - x[0]) / np.timedelta64(1, "s")
    assert x[0] == np.datetime64("2026-11-29T15:30")
    area_kj = sum(float(np.sum(y[:-1] * np.diff(x_s))) for y in ys)  # kW x s, step "post"
    assert area_kj * 1e3 == pytest.approx(fleet["energy_j"].sum())


def test_the_per_gpu_strips_draw_every_bucket_one_bucket_jobs_and_the_last_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # fill_between(where=label, step="post") fills a value from its x to the next x of the same
    # run: a label's last bucket, a job of one bucket and the GPU's last bucket were not drawn.
    from matplotlib.axes import Axes

    from wattclass.report import plots

    filled: list[float] = []
    real = Axes.fill_between

    def spy(self: Axes, *args: object, **kw: object) -> object:
        coll = real(self, *args, **kw)
        for path in coll.get_paths():  # the polygons' area (shoelace), in days x W
            x, y = path.vertices[:, 0], path.vertices[:, 1]
            filled.append(0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))))
        return coll

    monkeypatch.setattr(Axes, "fill_between", spy)
    t0 = pd.Timestamp("2026-11-29 10:00", tz="UTC")
    labels = ["memory", "memory", "compute", "memory", "idle", "compute"]
    power = [300.0, 310.0, 650.0, 320.0, 90.0, 600.0]
    tl = pd.DataFrame({"host": "n1", "gpu_index": 0, "ts_start": t0 + pd.to_timedelta(range(6), unit="min"),
                       "power_avg_w": power, "label": labels})
    plots.power_timeline(tl)
    assert sum(filled) == pytest.approx(sum(power) * 60 / 86400, rel=1e-6)
