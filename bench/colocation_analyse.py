"""Attribution error on a shared GPU, from a ``bench/colocation_collect.py`` recording (CPU only).

For each co-located pair (a, b) over its steady span (the first second of each run dropped):

* references, from the solo runs of the same workloads and the idle GPU:
  - solo-proportional (time): shares ~ solo power P_a : P_b;
  - solo-proportional (work): shares ~ the energy each would have used alone for the work it did
    in the pair (P_a x iterations_in_pair / solo rate);
  - Shapley (time): phi_a = (P_a + P_ab - P_b) / 2 over the same span (v of the empty set 0,
    so the idle power is split equally);
  - Shapley (work): the same with v({a}) the solo energy for a's work in the pair;
* methods, from what the daemon sees in the pair run alone: the wattclass model
  (``telemetry.sharing.split_shares``: static + per-process SM utilisation + memory held), SM
  utilisation only (no static part), memory held only, equal split.

The error of a method against a reference is |share_a(method) - share_a(reference)| in percentage
points of the pair's energy (with two jobs, b's error is the same). Prints a Markdown report and
writes the figures as JSON next to the recording with ``--json``.

    python bench/colocation_analyse.py docs/measurements/h200-colocation-2026-11-30
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from wattclass.telemetry.sharing import split_shares

RAMP_S = 1.0


def _load(folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    samples = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x]
    runs = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines() if x]
    meta = json.loads((folder / "meta.json").read_text())
    return samples, runs, meta


def _span(samples: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """Energy, power, per-pid SM utilisation sums and memory over the run's steady span."""
    a, b = run["start"] + RAMP_S, run["end"]
    ss = [s for s in samples if a <= s["ts_e"] <= b]
    if len(ss) < 3:
        raise SystemExit(f"{run['scenario']}: only {len(ss)} samples in its span")
    t0, t1 = ss[0]["ts_e"], ss[-1]["ts_e"]
    e_j = (ss[-1]["energy_mj"] - ss[0]["energy_mj"]) / 1e3
    sm: dict[int, float] = {}
    mem: dict[int, list[float]] = {}
    for s in ss[1:]:
        for pid, ts_us, smu, _memu in s.get("putil", []):
            if t0 * 1e6 < ts_us <= t1 * 1e6:
                sm[pid] = sm.get(pid, 0.0) + smu
        for pid, mib in s.get("procs", []):
            mem.setdefault(pid, []).append(mib)
    rates = {}
    iters = {}
    for w, pts in run["progress"].items():
        inside = [p for p in pts if a <= p[0] <= b] or pts
        iters[w] = inside[-1][1] - inside[0][1]
        rates[w] = iters[w] / max(inside[-1][0] - inside[0][0], 1e-9)
    return {"energy_j": e_j, "dur_s": t1 - t0, "power_w": e_j / (t1 - t0), "sm": sm,
            "mem": {p: statistics.fmean(v) for p, v in mem.items()}, "rates": rates, "iters": iters}


def analyse(folder: Path) -> dict[str, Any]:
    samples, runs, meta = _load(folder)
    idle = next(r for r in runs if r["scenario"] == "gpu_idle")
    p0 = _span(samples, idle)["power_w"]
    solo: dict[str, dict[str, Any]] = {}
    for r in runs:
        if len(r["workers"]) == 1 and r["workers"][0] not in solo:  # the first solo run of each
            solo[r["workers"][0]] = _span(samples, r)
    drift = [r for r in runs if len(r["workers"]) == 1][-1]
    drift_w = _span(samples, drift)["power_w"] - solo[drift["workers"][0]]["power_w"]
    # The second worker of a same-kind pair uses the solo run of its kind.
    kind_solo = {r["kinds"][0]: solo[r["workers"][0]] for r in runs if len(r["workers"]) == 1}
    pairs = []
    for r in runs:
        if len(r["workers"]) != 2:
            continue
        sp = _span(samples, r)
        (wa, wb), (ka, kb), (pa, pb) = r["workers"], r["kinds"], r["pids"]
        sa, sb = kind_solo[ka], kind_solo[kb]
        Pa, Pb, Pab, T = sa["power_w"], sb["power_w"], sp["power_w"], sp["dur_s"]
        ra, rb = sa["rates"][next(iter(sa["rates"]))], sb["rates"][next(iter(sb["rates"]))]
        wa_s = sp["iters"][wa] / ra if ra > 0 else 0.0  # solo seconds for a's work in the pair
        wb_s = sp["iters"][wb] / rb if rb > 0 else 0.0
        Ea_w, Eb_w = Pa * wa_s, Pb * wb_s
        refs = {
            "solo_time": Pa / (Pa + Pb),
            "solo_work": Ea_w / (Ea_w + Eb_w) if Ea_w + Eb_w > 0 else 0.5,
            "shapley_time": 0.5 * (Pa + Pab - Pb) / Pab,
            "shapley_work": 0.5 * (Ea_w + Pab * T - Eb_w) / (Pab * T),
        }
        sm = {"a": sp["sm"].get(pa, 0.0), "b": sp["sm"].get(pb, 0.0)}
        mem = {"a": sp["mem"].get(pa, 0.0), "b": sp["mem"].get(pb, 0.0)}
        methods = {
            "wattclass": split_shares(["a", "b"], sm, mem, sp["energy_j"], T, p0).ratios["a"],
            "sm_only": split_shares(["a", "b"], sm, {}, sp["energy_j"], T, 0.0, sm_weight=1.0).ratios["a"],
            "memory_only": split_shares(["a", "b"], {}, mem, sp["energy_j"], T, 0.0).ratios["a"],
            "equal": 0.5,
        }
        pairs.append({
            "pair": f"{ka}+{kb}", "power_a_solo_w": Pa, "power_b_solo_w": Pb, "power_pair_w": Pab,
            "additive_w": Pa + Pb - p0, "speed_a": sp["rates"][wa] / ra if ra else None,
            "speed_b": sp["rates"][wb] / rb if rb else None,
            "sm_a": sm["a"], "sm_b": sm["b"], "mem_a_mib": mem["a"], "mem_b_mib": mem["b"],
            "refs": refs, "methods": methods,
            "error_pp": {m: {r: abs(v - rv) * 100 for r, rv in refs.items()} for m, v in methods.items()},
        })
    mean_err = {m: {r: statistics.fmean(p["error_pp"][m][r] for p in pairs) for r in pairs[0]["refs"]}
                for m in pairs[0]["methods"]}
    max_err = {m: {r: max(p["error_pp"][m][r] for p in pairs) for r in pairs[0]["refs"]}
               for m in pairs[0]["methods"]}
    ref_gap = {"solo_time_vs_shapley_time": statistics.fmean(
        abs(p["refs"]["solo_time"] - p["refs"]["shapley_time"]) * 100 for p in pairs)}
    return {"meta": meta, "idle_w": p0, "drift_w": drift_w,
            "solo_w": {w: s["power_w"] for w, s in solo.items()}, "pairs": pairs,
            "mean_error_pp": mean_err, "max_error_pp": max_err, "reference_gap_pp": ref_gap}


def report(res: dict[str, Any]) -> str:
    refs = list(res["pairs"][0]["refs"])
    lines = [f"GPU idle {res['idle_w']:.0f} W; solo: " + ", ".join(
        f"{w} {p:.0f} W" for w, p in res["solo_w"].items()) + f"; drift of the repeated GEMM "
        f"solo {res['drift_w']:+.1f} W", "",
        "| pair (a+b) | P_a, P_b solo | P_ab (sum-idle) | speed a, b | share of a: " + ", ".join(refs)
        + " | wattclass | sm only | memory only |", "|" + "---|" * 8]
    for p in res["pairs"]:
        r, m = p["refs"], p["methods"]
        lines.append(
            f"| {p['pair']} | {p['power_a_solo_w']:.0f}, {p['power_b_solo_w']:.0f} W | "
            f"{p['power_pair_w']:.0f} ({p['additive_w']:.0f}) W | "
            f"{(p['speed_a'] or 0) * 100:.0f}%, {(p['speed_b'] or 0) * 100:.0f}% | "
            + ", ".join(f"{r[k] * 100:.0f}" for k in refs)
            + f" | {m['wattclass'] * 100:.0f} | {m['sm_only'] * 100:.0f} | {m['memory_only'] * 100:.0f} |")
    lines += ["", "| method | " + " | ".join(f"vs {r} (mean / max pp)" for r in refs) + " |",
              "|" + "---|" * (len(refs) + 1)]
    for meth, errs in res["mean_error_pp"].items():
        lines.append(f"| {meth} | " + " | ".join(
            f"{errs[r]:.1f} / {res['max_error_pp'][meth][r]:.1f}" for r in refs) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    res = analyse(args.folder)
    print(report(res))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
