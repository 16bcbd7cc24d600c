"""The report's figures: matplotlib (Agg) -> PNG bytes, one function per figure.

Pure functions of DataFrames so the HTML layer only places images; the Agg backend is forced
so a node or CI machine with no display renders the same pictures.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

COLORS: dict[str, str] = {
    "compute": "#d62728",
    "memory": "#1f77b4",
    "mixed": "#9467bd",
    "idle": "#8c8c8c",
    "unlabelled": "#e6a817",
    "no job": "#d9d9d9",
}


def color(label: str) -> str:
    return COLORS.get(label, "#2ca02c")


def to_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _bars(ax: Axes, labels: Sequence[str], values: Sequence[float], fmt: str, title: str) -> None:
    x = np.arange(len(labels))
    bars = ax.bar(x, values, color=[color(lab) for lab in labels])
    ax.set_xticks(x, labels)
    ax.set_title(title, fontsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    for b, v in zip(bars, values, strict=True):
        ax.annotate(
            fmt.format(v),
            (b.get_x() + b.get_width() / 2, b.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 2),
            textcoords="offset points",
        )


def energy_and_hours(t: pd.DataFrame) -> bytes:
    """Energy (kWh) and GPU-hours by label, side by side; and kWh per GPU-hour."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    labels = list(t.index)
    _bars(axes[0], labels, list(t["energy_kwh"]), "{:.3g}", "Energy (kWh)")
    _bars(axes[1], labels, list(t["gpu_hours"]), "{:.3g}", "GPU-hours")
    _bars(axes[2], labels, list(t["kwh_per_gpu_hour"].fillna(0)), "{:.2f}", "kWh per GPU-hour (= mean kW)")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    return to_png(fig)


def power_timeline(w: pd.DataFrame, max_gpus: int = 16) -> bytes:
    """Power per window for each GPU, filled in the colour of the job's label."""
    gpus = w[["host", "gpu_index"]].drop_duplicates().sort_values(["host", "gpu_index"]).head(max_gpus)
    n = len(gpus)
    fig, axes = plt.subplots(n, 1, figsize=(13, max(2.6, 0.75 * n + 1.0)), sharex=True, squeeze=False)
    ymax = float(np.nanmax(w["power_avg_w"].astype(float))) if len(w) else 1.0
    for ax, (host, idx) in zip(axes[:, 0], gpus.itertuples(index=False), strict=True):
        g = w[(w["host"] == host) & (w["gpu_index"] == idx)].sort_values("ts_start")
        t, heights = _strip_steps(g)
        for label, h in heights.items():
            ax.fill_between(t, 0, h, step="post", color=color(label), linewidth=0)
        ax.set_ylim(0, ymax * 1.05)
        ax.set_yticks([0, round(ymax / 100) * 100])
        ax.set_ylabel(f"{host}\nGPU {idx}", rotation=0, ha="right", va="center", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    present = [lab for lab in COLORS if lab in set(w["label"])]
    fig.legend(
        handles=[Patch(color=color(lab), label=lab) for lab in present],
        loc="upper center",
        ncol=len(present),
        frameon=False,
        bbox_to_anchor=(0.5, 1.0),
    )
    axes[-1, 0].set_xlabel("time (UTC); y: mean power per window (W)")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return to_png(fig)


def _strip_steps(g: pd.DataFrame) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One GPU's buckets (``ts_start``, ``power_avg_w``, ``label``, sorted) as "post" steps: the
    times, with one more at the end (the shortest step on), and per label the power of its
    buckets (0 elsewhere), the last value repeated at that end. A "post" step draws a value from
    its x to the next; filled ``where`` the label held, each run of a label lost its last bucket
    (a one-bucket job was not drawn at all), as did the GPU's last bucket."""
    t = g["ts_start"].dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    p = g["power_avg_w"].astype(float).fillna(0).to_numpy()
    step = np.diff(t).min() if len(t) > 1 else np.timedelta64(60, "s")
    t = np.append(t, t[-1] + step)
    lab = g["label"].astype(str).to_numpy()
    heights = {}
    for label in dict.fromkeys(lab):
        h = np.where(lab == label, p, 0.0)
        heights[label] = np.append(h, h[-1])
    return t, heights


def fleet_power(fleet: pd.DataFrame, t0: pd.Timestamp, width_s: float) -> bytes:
    """Total power of all GPUs over time, stacked by label: the view that stays readable at 1,000 GPUs.

    ``fleet``: energy per time bin (``bin``, ``label``, ``energy_j``; ``report.data``), bins
    ``width_s`` long from ``t0`` (where bin 0 starts); a bin's height is its energy over its
    length, so the area is the energy.
    """
    present, xs, stack = fleet_steps(fleet, t0, width_s)
    fig, ax = plt.subplots(figsize=(13, 3.8))
    ax.stackplot(xs.to_numpy(), *stack, labels=present, colors=[color(n) for n in present], step="post")
    ax.set_ylabel("kW (all GPUs)")
    ax.set_xlabel("time (UTC)")
    ax.legend(loc="upper center", ncol=len(present), frameon=False, bbox_to_anchor=(0.5, 1.12))
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return to_png(fig)


def fleet_steps(fleet: pd.DataFrame, t0: pd.Timestamp, width_s: float
                ) -> tuple[list[str], pd.DatetimeIndex, list[np.ndarray]]:
    """``fleet_power``'s steps: the labels drawn, the bins' edges (UTC, naive) and per label the
    power (kW) of each bin, its last value repeated at the last edge: a "post" step draws a
    value from its x to the next one, so with one x per bin the last bin was not drawn at all."""
    width = max(float(width_s), 1e-9)
    bins = int(fleet["bin"].max()) + 1 if len(fleet) else 1
    labels = set(fleet["label"])
    present = [lab for lab in COLORS if lab in labels] + sorted(labels - set(COLORS))
    b = fleet["bin"].to_numpy(dtype=int)
    e = fleet["energy_j"].astype(float).fillna(0).to_numpy()
    lab = fleet["label"].to_numpy()
    xs = pd.DatetimeIndex(t0 + pd.to_timedelta(np.arange(bins + 1) * width, unit="s"))
    if xs.tz is not None:
        xs = xs.tz_convert("UTC").tz_localize(None)
    stack = []
    for n in present:
        kw = np.bincount(b[lab == n], weights=e[lab == n], minlength=bins)[:bins] / width / 1e3
        stack.append(np.append(kw, kw[-1]))
    return present, xs, stack


def work_per_energy(t: pd.DataFrame) -> bytes:
    """Estimated TFLOP/s per kW by label."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    _bars(
        ax, list(t.index), list(t["tflops_per_kw"]), "{:.0f}", "Estimated TFLOP/s per kW (GPM pipe activity)"
    )
    fig.tight_layout()
    return to_png(fig)


def confusion(matrix: Sequence[Sequence[float]], classes: Sequence[str]) -> bytes:
    """Confusion matrix heatmap, rows = true label, columns = predicted."""
    m = np.asarray(matrix, dtype=float)
    fig, ax = plt.subplots(figsize=(1.0 * len(classes) + 2.5, 1.0 * len(classes) + 1.5))
    ax.imshow(m, cmap="Blues")
    ax.set_xticks(range(len(classes)), classes, rotation=30)
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true (GPM rule)")
    vmax = m.max() if m.size else 1
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            ax.text(
                j,
                i,
                f"{m[i, j]:g}",
                ha="center",
                va="center",
                color="white" if m[i, j] > vmax / 2 else "black",
            )
    fig.tight_layout()
    return to_png(fig)


def decisions(counts: pd.Series) -> bytes:
    """Jobs per decision/cap (horizontal bars)."""
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(counts) + 1.2))
    y = np.arange(len(counts))
    ax.barh(y, counts.to_numpy(), color="#4c72b0")
    ax.set_yticks(y, [str(i) for i in counts.index])
    ax.invert_yaxis()
    ax.set_xlabel("jobs")
    for yi, v in zip(y, counts.to_numpy(), strict=True):
        ax.annotate(str(int(v)), (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return to_png(fig)


def savings(t: pd.DataFrame, slowdown: float) -> bytes:
    """Measured energy per label with the estimated saving stacked on top of what remains."""
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    labels = list(t.index)
    x = np.arange(len(labels))
    kept = (t["energy_kwh"] - t["saved_kwh"]).to_numpy()
    # The bars take each label's colour (as in every other figure), so the legend says so in words
    # instead of showing one label's colour for all of them.
    ax.bar(x, kept, color=[color(lab) for lab in labels])
    ax.bar(
        x,
        t["saved_kwh"].to_numpy(),
        bottom=kept,
        color="#2ca02c",
        alpha=0.6,
        label="saved if no slowdown (estimate)",
    )
    ax.scatter(
        x,
        (t["energy_kwh"] - t["saved_kwh_slow"]).to_numpy(),
        marker="_",
        s=400,
        color="black",
        label=f"energy with caps if {slowdown:.0%} slower",
        zorder=3,
    )
    ax.set_xticks(x, labels)
    ax.set_ylabel("kWh (bar colour: the label)")
    handles, _ = ax.get_legend_handles_labels()
    handles.insert(0, Patch(facecolor="white", edgecolor="#555", label="energy with caps (estimate)"))
    ax.legend(handles=handles, frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return to_png(fig)
