"""sbatch throughput with and without wattclass's job_submit.lua (target: with >= 97% of without).

Also (``--lua-sizes``) the label table's cost inside Lua 5.1 at 10k, 100k and 1M keys: the time
job_submit.lua takes to read and parse the table (paid once per table change, by the first
submission after it), its memory, and the per-submission cost of slurm_job_submit with the table
cached, measured with lua5.1 running the real job_submit.lua (slurmctld embeds the same Lua 5.1).

Starts two real one-node Slurm 22.05 clusters side by side (tests/slurm_cluster.py), one with
the plugin and one without, and submits N held jobs to each one after another (sequential, like a
user's loop), alternating between the clusters in random order so that load from other
processes on the machine hits both alike; reports submissions per second per cluster. Held
jobs never run, so only submission is measured. The label table holds ``--entries`` keys so the
lookup works on a realistic table; half the job names hit it.

    python bench/sbatch_throughput.py [--jobs 1000] [--rounds 2] [--entries 20000] [--empty-lua] [--json]

``--empty-lua`` adds a third cluster whose job_submit.lua does nothing: Slurm's job_submit/lua
plugin's own cost, to tell it from wattclass's script.
    python bench/sbatch_throughput.py --lua-sizes 10000,100000,1000000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_cluster import SlurmCluster

from wattclass.labeltable import MAX_NAMES_PER_USER, TableEntry, write_label_table
from wattclass.plugin.install import render_job_submit
from wattclass.policy import parse_policy


def root_names(entries: int) -> int:
    """How many of the keys are root's (who submits): a user keeps at most MAX_NAMES_PER_USER."""
    return min(entries, MAX_NAMES_PER_USER)


def write_table(table: Path, entries: int) -> None:
    """``entries`` user + job name keys: root's (half the benchmark's names hit them), the rest of
    other users, since the writer keeps at most MAX_NAMES_PER_USER names per user."""
    table.parent.mkdir(parents=True, exist_ok=True)
    table.parent.chmod(0o755)
    pol = parse_policy({"mode": "enforce", "caps": {"memory": "60%"},
                        "placement": {"memory": {"features": ["hbm"]}}})
    mine = root_names(entries)
    ents = [TableEntry("user_name", "root", f"job-{i}", None, "memory", 0.95, 3, "rule")
            for i in range(mine)]
    ents += [TableEntry("user_name", f"u{i // MAX_NAMES_PER_USER:05d}", f"job-{i}", None, "memory", 0.95, 3,
                        "rule") for i in range(entries - mine)]
    write_label_table(table, ents, pol.table_dict({"hbm"}), max_entries=max(entries, 1))


EMPTY_LUA = """-- an empty job_submit.lua: what Slurm's job_submit/lua plugin costs by itself
function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
return slurm.SUCCESS
"""


def make_cluster(root: Path, variant: str, entries: int) -> SlurmCluster:
    """``without``: no job_submit plugin; ``empty``: job_submit/lua with a script that does
    nothing (the plugin framework's own cost); ``with``: wattclass's job_submit.lua."""
    lua = EMPTY_LUA if variant == "empty" else None
    if variant == "with":
        table = root / "labels" / "labels.tsv"
        write_table(table, entries)
        lua = render_job_submit(table)
    return SlurmCluster(root, job_submit_lua=lua)


LUA_BENCH = r"""
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_verbose = function() end,
          log_error = function() end }
dofile(SCRIPT)
collectgarbage("collect")
local kb0 = collectgarbage("count")
local t0 = os.clock()
local t, err = wattclass_load_table()
local load_s = os.clock() - t0
if t == nil then error(err) end
collectgarbage("collect")
local kb = collectgarbage("count") - kb0
local parts = { main = { flag_default = 1 } }
local n = N_SUBMIT
t0 = os.clock()
for i = 1, n do
  local name = "job-" .. (i * 7919 % KEYS)
  if i % 2 == 0 then name = "unknown-" .. i end
  local jd = { user_name = "root", name = name,
               tres_per_node = "gres:gpu:1" }
  slurm_job_submit(jd, parts, 0)
end
local per_s = (os.clock() - t0) / n
print(string.format("%.6f %.1f %.9f", load_s, kb, per_s))
"""


def lua_costs(keys: int, n_submit: int = 20000) -> dict[str, float]:
    """Load time, memory and per-submission CPU time of the real job_submit.lua in lua5.1."""
    root = Path(tempfile.mkdtemp(prefix="wattclass-luabench-"))
    try:
        root.chmod(0o755)
        table = root / "labels" / "labels.tsv"
        write_table(table, keys)
        script = root / "job_submit.lua"
        # the whole table, even past job_submit.lua's MAX_BYTES, so 1M keys measure 1M keys
        script.write_text(render_job_submit(table).replace("local MAX_BYTES = 16 * 1024 * 1024",
                                                           "local MAX_BYTES = 1024 * 1024 * 1024"))
        drv = root / "bench.lua"
        drv.write_text(f'SCRIPT = "{script}"\nN_SUBMIT = {n_submit}\nKEYS = {root_names(keys)}\n' + LUA_BENCH)
        out = subprocess.run(["lua5.1", str(drv)], capture_output=True, text=True, check=True,
                             timeout=600).stdout.split()
        return {"keys": keys, "table_bytes": table.stat().st_size, "load_s": round(float(out[0]), 3),
                "lua_mib": round(float(out[1]) / 1024, 1),
                "per_submission_us": round(float(out[2]) * 1e6, 2)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def submit(c: SlurmCluster, name: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["sbatch", "-H", "-o", "/dev/null", "-J", name, "--gres=gpu:1"],
                   input="#!/bin/sh\ntrue\n", env=c.env, capture_output=True, check=True,
                   text=True, timeout=30)
    return time.perf_counter() - t0


def run_round(jobs: int, entries: int, seed: int, variants: list[str]) -> dict[str, float]:
    """All clusters up at once; submissions alternate in random order so machine noise hits all."""
    rng = random.Random(seed)
    roots = {v: Path(tempfile.mkdtemp(prefix=f"wattclass-bench-{v}-")) for v in variants}
    clusters = {v: make_cluster(roots[v], v, entries) for v in roots}
    try:
        for c in clusters.values():
            c.start()
        for c in clusters.values():
            c.sbatch("-H", "-o", "/dev/null", "-J", "warmup")
        spent = dict.fromkeys(variants, 0.0)
        for i in range(jobs):
            name = f"job-{i}" if i % 2 == 0 else f"unknown-{i}"
            order = list(variants)
            rng.shuffle(order)
            for v in order:
                spent[v] += submit(clusters[v], name)
        job = clusters["with"].job(clusters["with"].sbatch("-H", "-o", "/dev/null", "-J", "job-0",
                                                           "--gres=gpu:1"))
        if not job.get("admin_comment"):
            raise RuntimeError("plugin did not label a known job: the benchmark measured nothing")
        return {v: jobs / t for v, t in spent.items()}
    finally:
        for c in clusters.values():
            c.stop()
        for r in roots.values():
            shutil.rmtree(r, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--empty-lua", action="store_true",
                    help="also run a third cluster with an empty job_submit.lua: the cost of Slurm's "
                         "job_submit/lua plugin itself, apart from wattclass's script")
    ap.add_argument("--lua-sizes",
                    help="comma list of table sizes: measure Lua load/per-submission cost only")
    a = ap.parse_args()
    if a.lua_sizes:
        res = {"load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
               "sizes": [lua_costs(int(k)) for k in a.lua_sizes.split(",")]}
        if a.json:
            print(json.dumps(res, indent=2))
        else:
            for r in res["sizes"]:
                print(f"{r['keys']:>8} keys ({r['table_bytes'] / 1e6:.1f} MB): load {r['load_s']:.3f} s, "
                      f"{r['lua_mib']} MiB in Lua, {r['per_submission_us']:.1f} us per submission")
        return 0
    variants = ["without", "with"] + (["empty"] if a.empty_lua else [])
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(a.rounds):
        got = run_round(a.jobs, a.entries, seed=r, variants=variants)
        for v, rate in got.items():
            rates[v].append(round(rate, 1))
    med = {k: statistics.median(v) for k, v in rates.items()}
    # The ratio is the median of the rounds' own ratios: each round's clusters ran side by side
    # under the same conditions, while absolute rates move by 30% between rounds (file system
    # state), so a ratio of medians could pair one round's "with" with another's "without".
    per_round = [w / wo for w, wo in zip(rates["with"], rates["without"], strict=True)]
    out = {"jobs": a.jobs, "rounds": a.rounds, "table_entries": a.entries, "rates_per_s": rates,
           "median_without": round(med["without"], 1), "median_with": round(med["with"], 1),
           "ratio": round(statistics.median(per_round), 4), "target": 0.97,
           "ratio_of_medians": round(med["with"] / med["without"], 4)}
    out["ratio_per_round"] = [round(r, 4) for r in per_round]
    out["pass"] = out["ratio"] >= 0.97
    if a.empty_lua:
        out["median_empty_lua"] = round(med["empty"], 1)
        out["ratio_empty_lua_vs_without"] = round(statistics.median(
            e / wo for e, wo in zip(rates["empty"], rates["without"], strict=True)), 4)
        out["ratio_with_vs_empty_lua"] = round(statistics.median(
            w / e for w, e in zip(rates["with"], rates["empty"], strict=True)), 4)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"sbatch/s without plugin {out['median_without']}, with plugin {out['median_with']} "
              f"({a.jobs} sequential submissions x {a.rounds} rounds, {a.entries}-entry table): "
              f"ratio {out['ratio']:.3f} (target >= 0.97) {'PASS' if out['pass'] else 'FAIL'}")
        if a.empty_lua:
            print(f"empty job_submit.lua {out['median_empty_lua']} sbatch/s: empty/without "
                  f"{out['ratio_empty_lua_vs_without']:.3f}, "
                  f"wattclass/empty {out['ratio_with_vs_empty_lua']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
