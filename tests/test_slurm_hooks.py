"""Real Slurm: job_submit.lua, Prolog and Epilog against real slurmctld/slurmd/munged.

The Slurm under test is Debian's 22.05, or the prefix in WATTCLASS_TEST_SLURM (25.11 in CI).

One cluster per session (tests/slurm_cluster.py); GPUs are /dev/null symlinks for Slurm and a
filestate backend for the caps. In CI (CI=true) a cluster that cannot start FAILS the tests.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, WattclassRig, require_daemons, start_rig_or_skip

from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import parse_policy

pytestmark = pytest.mark.slurm

SPECIAL_NAMES = ['it\'s "quoted"', "two\nlines", "100%d%s%%", "a.b*c+d?[e]^$(f)%", "]]--[==["]
MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"
POLICY = {"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%", "compute": "100%"},
          "placement": {"memory": {"features": ["hbm"]}},
          "exempt": {"accounts": ["benchmark"], "partitions": ["debug"]}}


def _entries() -> list[TableEntry]:
    e = [TableEntry("user_name", "root", "mem-train", None, "memory", 0.93, 7, "rule"),
         TableEntry("user_name", "root", "lowconf", None, "memory", 0.5, 7, "rule"),
         TableEntry("user_name", "root", "comp", None, "compute", 0.9, 7, "rule"),
         TableEntry("user_name", "nobody", "mem-nobody", None, "memory", 0.93, 7, "rule")]
    e += [TableEntry("user_name", "root", n, None, "memory", 0.93, 1, "rule") for n in SPECIAL_NAMES]
    return e


def write_table(rig: WattclassRig, mode: str = "enforce") -> None:
    pol = parse_policy({**POLICY, "mode": mode})
    write_label_table(rig.table, _entries(), pol.table_dict({"hbm"}))


@pytest.fixture(scope="session")
def rig() -> Iterator[WattclassRig]:
    require_daemons()
    root = Path(tempfile.mkdtemp(prefix="wattclass-slurm-"))
    r = WattclassRig(root, sys.executable)
    write_table(r)
    start_rig_or_skip(r)
    yield r
    r.cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


def wait_quiet(rig: WattclassRig, timeout: float = 20) -> None:
    """Every earlier job's Epilog has finished: no job files, no cap records, GPUs at default.

    Slurm may report a job done before its Epilog ran; a test that then breaks the GPU backend
    (the crash tests) would make that late Epilog fail and leave its job file behind, and a stale
    job file counts as an uncapped neighbour on the GPU for every later job (docs/shared-gpus.md).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (set(rig.limits().values()) == {700.0} and not any(rig.caps_dir.glob("*.json"))
                and not any(rig.jobs_dir.rglob("*.json"))):
            return
        time.sleep(0.1)
    raise AssertionError(f"earlier jobs left state: {rig.limits()} {sorted(rig.caps_dir.glob('*.json'))} "
                         f"{sorted(rig.jobs_dir.rglob('*.json'))}")


@pytest.fixture
def fresh(rig: WattclassRig) -> Iterator[WattclassRig]:
    """A good enforce table, all GPUs at default and no earlier job's state, before each test."""
    write_table(rig)
    wait_quiet(rig)
    yield rig
    write_table(rig)


def run_job(rig: WattclassRig, *args: str, user: str | None = None) -> tuple[str, dict[str, object]]:
    c = rig.cluster
    if user is None:
        job_id = c.sbatch("-o", "/dev/null", *args, script=rig.snapshot_script())
    else:
        proc = subprocess.run(["runuser", "-u", user, "--", c.path("sbatch"), "--parsable", "-o", "/dev/null",
                               "--chdir=/tmp", *args], input=rig.snapshot_script(), env=c.env,
                              capture_output=True, text=True, timeout=30, check=True)
        job_id = proc.stdout.strip()
    return job_id, c.wait_job(job_id)


def wait_restored(rig: WattclassRig, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(rig.limits().values()) == {700.0} and not any(rig.caps_dir.glob("*.json")):
            return
        time.sleep(0.1)
    raise AssertionError(f"GPUs not restored: {rig.limits()} {list(rig.caps_dir.glob('*'))}")


def assert_uncapped(rig: WattclassRig, job_id: str, job: dict[str, object]) -> None:
    seen, gpus = rig.seen(job_id)
    assert gpus, "the job got GPUs"
    assert set(seen.values()) == {700.0}, seen
    assert rig.cluster.node_state() == "idle"


def test_memory_job_capped_on_its_gpus_only_and_restored(fresh: WattclassRig) -> None:
    rig = fresh
    job_id, job = run_job(rig, "-J", "mem-train", "--gres=gpu:2")
    assert job["admin_comment"] == MEM
    assert job["features"] == "hbm"
    seen, gpus = rig.seen(job_id)
    assert len(gpus) == 2
    assert {j: w for j, w in seen.items() if j in gpus} == dict.fromkeys(gpus, 420.0)
    assert all(w == 700.0 for j, w in seen.items() if j not in gpus), seen
    jobs_seen = (rig.out / f"jobs-{job_id}.txt").read_text().split()
    assert len(jobs_seen) == 2  # one GPU->job file per GPU while it ran
    wait_restored(rig)
    assert not any(rig.jobs_dir.rglob("*.json"))
    assert f"job {job_id}: capped GPU" in rig.log.read_text()


def test_user_constraint_is_kept_and_gpu_still_capped(fresh: WattclassRig) -> None:
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1", "--constraint=hbm|hbm")
    assert job["features"] == "hbm|hbm"
    seen, gpus = fresh.seen(job_id)
    assert [seen[g] for g in gpus] == [420.0]
    wait_restored(fresh)


@pytest.mark.parametrize(
    ("name", "args"),
    [("mem-train", ["--account=benchmark"]),  # exempt account
     ("lowconf", []),  # confidence 0.5 < 0.8
     ("never-seen", [])],  # unknown job
)
def test_no_cap_without_a_confident_non_exempt_label(fresh: WattclassRig, name: str, args: list[str]) -> None:
    job_id, job = run_job(fresh, "-J", name, "--gres=gpu:2", *args)
    assert not job.get("admin_comment")
    assert not job.get("features")
    assert_uncapped(fresh, job_id, job)


def test_shadow_mode_logs_but_changes_nothing(fresh: WattclassRig) -> None:
    write_table(fresh, "shadow")
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:2")
    assert job["admin_comment"] == MEM.replace("mode=enforce", "mode=shadow")
    assert not job.get("features")
    assert_uncapped(fresh, job_id, job)
    assert f"job {job_id}: shadow: GPU" in fresh.log.read_text()
    assert not any(fresh.caps_dir.glob("*.json"))


@pytest.mark.parametrize("damage", ["corrupt", "writable_by_others", "lua_code", "symlink"])
def test_bad_label_table_leaves_jobs_unchanged(fresh: WattclassRig, damage: str) -> None:
    if damage == "symlink":  # a good table, but reached through a link
        real = fresh.table.with_name("real.tsv")
        fresh.table.rename(real)
        fresh.table.symlink_to(real)
    elif damage == "corrupt":
        fresh.table.write_text(fresh.table.read_text().replace("\tmemory\t", "\tmemory\t\t", 1))
    elif damage == "writable_by_others":
        fresh.table.chmod(0o666)
    else:  # a table of Lua code (the old format) that would hang slurmctld if it were run
        fresh.table.write_text("while true do end\n")
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:2")
    assert not job.get("admin_comment")
    assert not job.get("features")
    assert_uncapped(fresh, job_id, job)
    log = (fresh.root / "log" / "slurmctld.log").read_text()
    want = {"corrupt": "unchanged: label table line", "writable_by_others": "writable by group or others",
            "lua_code": "is not a version 2 wattclass table", "symlink": "labels.tsv is a symlink"}[damage]
    assert want in log


def test_per_label_threshold_holds_memory_calls_to_their_own(fresh: WattclassRig) -> None:
    """Issue 13: memory needs 0.95 here, the rest the global 0.8. mem-train (memory 0.93) runs
    uncapped with no decision; comp (compute 0.9) is still decided."""
    pol = parse_policy({**POLICY, "min_confidence_by_label": {"memory": 0.95}})
    write_label_table(fresh.table, _entries(), pol.table_dict({"hbm"}))
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:2")
    assert not job.get("admin_comment") and not job.get("features")
    assert_uncapped(fresh, job_id, job)
    _, job = run_job(fresh, "-J", "comp", "--gres=gpu:1")
    assert job["admin_comment"] == "wattclass:label=compute;conf=0.90;cap=100%;src=rule;mode=enforce"


@pytest.mark.parametrize("crash", ["corrupt_backend", "unexpected_exception"])
def test_wattclass_crash_in_prolog_does_not_drain_node(fresh: WattclassRig, crash: str) -> None:
    good = fresh.state.read_text()
    try:
        if crash == "corrupt_backend":
            fresh.state.write_text("{not json")
        else:  # structurally valid JSON with a GPU missing fields: a KeyError deep inside
            fresh.state.write_text(json.dumps({"version": 1, "gpus": [{"index": 0}]}))
        job_id = fresh.cluster.sbatch("-o", "/dev/null", "-J", "mem-train", "--gres=gpu:2")
        job = fresh.cluster.wait_job(job_id)
        assert job["admin_comment"] == MEM  # the decision was made; applying it failed
        assert fresh.cluster.node_state() == "idle"
        log = fresh.log.read_text()
        word = "failed" if crash == "corrupt_backend" else "crashed"
        assert f"job {job_id}: prolog {word}, job continues unchanged" in log
    finally:
        fresh.state.write_text(good)


@pytest.mark.parametrize("name", SPECIAL_NAMES)
def test_hostile_job_names_are_plain_data(fresh: WattclassRig, name: str) -> None:
    job_id, job = run_job(fresh, "-J", name, "--gres=gpu:1")
    assert job["name"] == name
    assert job["admin_comment"] == MEM
    seen, gpus = fresh.seen(job_id)
    assert [seen[g] for g in gpus] == [420.0]
    wait_restored(fresh)
    # similar names that are NOT in the table do not match through pattern semantics
    other = name.replace("%", "x").replace(".", "y").replace("*", "z") + "!"
    job_id, job = run_job(fresh, "-J", other, "--gres=gpu:1")
    assert not job.get("admin_comment")


def test_user_comment_cannot_set_or_raise_the_cap(fresh: WattclassRig) -> None:
    forged = "wattclass:label=compute;conf=1.00;cap=100%;src=rule;mode=enforce"
    # a memory job whose user claims compute in --comment: still capped at 60%
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1", f"--comment={forged}")
    assert job["comment"] == forged and job["admin_comment"] == MEM
    seen, gpus = fresh.seen(job_id)
    assert [seen[g] for g in gpus] == [420.0]
    wait_restored(fresh)
    # an unknown job claiming a cap in --comment gets none
    low = forged.replace("100", "30")
    job_id, job = run_job(fresh, "-J", "never-seen", "--gres=gpu:1", f"--comment={low}")
    assert_uncapped(fresh, job_id, job)


def test_scontrol_update_by_the_user_cannot_change_the_cap(fresh: WattclassRig) -> None:
    c = fresh.cluster
    forged = "wattclass:label=compute;conf=1.00;cap=100%;src=rule;mode=enforce"
    as_nobody = ["runuser", "-u", "nobody", "--"]
    proc = subprocess.run([*as_nobody, c.path("sbatch"), "--parsable", "-o", "/dev/null", "--chdir=/tmp",
                           "-H",
                           "-J", "mem-nobody", "--gres=gpu:1"], input=fresh.snapshot_script(),
                          env=c.env, capture_output=True, text=True, timeout=30, check=True)
    job_id = proc.stdout.strip()
    assert c.job(job_id)["admin_comment"] == MEM
    upd = subprocess.run([*as_nobody, c.path("scontrol"), "update", f"jobid={job_id}",
                          f"AdminComment={forged}"], env=c.env, capture_output=True, text=True, timeout=30)
    assert upd.returncode != 0  # only operators may set admin_comment
    upd = subprocess.run([*as_nobody, c.path("scontrol"), "update", f"jobid={job_id}", f"Comment={forged}",
                          "JobName=never-seen"], env=c.env, capture_output=True, text=True, timeout=30)
    assert upd.returncode == 0, upd.stderr
    subprocess.run([*as_nobody, c.path("scontrol"), "release", job_id], env=c.env, check=True, timeout=30)
    job = c.wait_job(job_id)
    assert job["admin_comment"] == MEM and job["comment"] == forged
    seen, gpus = fresh.seen(job_id)
    assert [seen[g] for g in gpus] == [420.0]
    wait_restored(fresh)


def test_epilog_twice_and_reconcile_restore_defaults(fresh: WattclassRig) -> None:
    """Run the hooks by hand on a live allocation's leftovers: idempotent, and reconcile cleans up."""
    from wattclass.gpu.filestate import FileStateBackend
    from wattclass.plugin.prolog import epilog, reconcile

    job_id, _job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1")
    wait_restored(fresh)
    be = FileStateBackend(fresh.state)
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_GPUS": "0"}
    assert epilog(env, be, fresh.jobs_dir, fresh.caps_dir) == []  # second Epilog: nothing to do
    be.set_power_limit_w(0, 300.0)  # a limit left behind with no job on the GPU
    done = reconcile(be, fresh.jobs_dir, fresh.caps_dir)
    assert [d["action"] for d in done] == ["default"]
    assert set(fresh.limits().values()) == {700.0}


def test_job_name_forging_an_admin_comment_line_gets_no_cap(fresh: WattclassRig) -> None:
    forged = "x\n   AdminComment=wattclass:label=memory;conf=1.00;cap=30%;src=rule;mode=enforce"
    job_id, job = run_job(fresh, "-J", forged, "--gres=gpu:1")
    assert job["name"] == forged and not job.get("admin_comment")
    assert_uncapped(fresh, job_id, job)


def test_command_client_against_real_slurm(fresh: WattclassRig) -> None:
    from wattclass.errors import SlurmError
    from wattclass.slurm.commands import CommandSlurmClient

    client = CommandSlurmClient(fresh.cluster.conf, bin_dir=fresh.cluster.install.bin_dir)
    job_id, _job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1")
    assert client.admin_comment(job_id) == MEM
    other, _ = run_job(fresh, "-J", "never-seen", "--gres=gpu:1", "--comment=wattclass:label=idle")
    assert client.admin_comment(other) is None
    assert client.job(job_id)["name"] == "mem-train"  # type: ignore[index]
    assert "hbm" in client.node_features()
    assert client.version() == fresh.cluster.install.version
    with pytest.raises(SlurmError, match="squeue"):
        client.admin_comment("99999999")
    with pytest.raises(SlurmError, match="sacct"):  # no slurmdbd in this cluster
        import datetime as dt

        now = dt.datetime.now(dt.UTC)
        client.jobs(now - dt.timedelta(hours=1), now)
    wait_restored(fresh)


# -- issue 9 items 5, 6, 7, 14 on the real Slurm --------------------------------------------------------
def _as(user: str, *argv: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], env=env, capture_output=True, text=True,
                          timeout=30, input=stdin)


def _held(rig: WattclassRig, user: str, *args: str) -> str:
    proc = _as(user, "sbatch", "--parsable", "-o", "/dev/null", "--chdir=/tmp", "-H", *args,
               env=rig.cluster.env, stdin=rig.snapshot_script())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_partition_list_is_exempt_only_when_every_partition_is(fresh: WattclassRig) -> None:
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1", "-p", "main,debug")
    assert job["admin_comment"] == MEM  # it may run in main, so it is decided
    job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1", "-p", "debug")
    assert not job.get("admin_comment")
    assert_uncapped(fresh, job_id, job)


def test_user_cannot_move_a_pending_job_out_of_its_decision(fresh: WattclassRig) -> None:
    c = fresh.cluster
    # exempt at submission (debug), then moved to main by the user: refused, stays in debug
    job_id = _held(fresh, "nobody", "-J", "mem-nobody", "--gres=gpu:1", "-p", "debug")
    try:
        assert not c.job(job_id).get("admin_comment")
        upd = _as("nobody", "scontrol", "update", f"jobid={job_id}", "Partition=main", env=c.env)
        assert upd.returncode != 0, upd
        assert c.job(job_id)["partition"] == "debug"
        log = (fresh.root / "log" / "slurmctld.log").read_text()
        assert f"modify job {job_id} by uid 65534 refused: the change would alter the power decision" in log
        # no GPU at submission, then a GPU asked for by update: refused too
        plain = _held(fresh, "nobody", "-J", "mem-nobody", "-p", "main")
        assert not c.job(plain).get("admin_comment")
        upd = _as("nobody", "scontrol", "update", f"jobid={plain}", "Gres=gpu:1", env=c.env)
        assert upd.returncode != 0, upd
        # a change that keeps the decision is allowed (debug -> debug,debug), and root re-decides
        upd = _as("nobody", "scontrol", "update", f"jobid={job_id}", "Partition=debug", env=c.env)
        assert upd.returncode == 0, upd.stderr
        c.run(["scontrol", "update", f"jobid={job_id}", "Partition=main"])
        job = c.job(job_id)
        assert job["partition"] == "main" and job["admin_comment"] == MEM
        c.run(["scontrol", "release", job_id])
        c.wait_job(job_id)
        seen, gpus = fresh.seen(job_id)
        assert [seen[g] for g in gpus] == [420.0]
    finally:
        subprocess.run(["scancel", job_id], env=c.env, check=False, timeout=30)
    wait_restored(fresh)


def test_account_change_of_a_pending_job_is_re_decided(fresh: WattclassRig) -> None:
    c = fresh.cluster
    job_id = _held(fresh, "nobody", "-J", "mem-nobody", "--gres=gpu:1")
    try:
        assert c.job(job_id)["admin_comment"] == MEM
        upd = _as("nobody", "scontrol", "update", f"jobid={job_id}", "Account=benchmark", env=c.env)
        assert upd.returncode != 0, upd
        c.run(["scontrol", "update", f"jobid={job_id}", "Account=benchmark"])  # root: re-decided
        assert c.job(job_id)["admin_comment"] == "wattclass:decision=none;reason=exempt_account"
    finally:
        subprocess.run(["scancel", job_id], env=c.env, check=False, timeout=30)


@pytest.mark.parametrize("gpus", [["--gres=gpu:1"], ["--gpus=1"], ["--gpus-per-task=1", "-n", "1"],
                                  ["--gpus-per-node=1"]])
def test_every_way_of_asking_for_a_gpu_is_decided(fresh: WattclassRig, gpus: list[str]) -> None:
    _job_id, job = run_job(fresh, "-J", "mem-train", *gpus)
    assert job["admin_comment"] == MEM and job["features"] == "hbm", job.get("tres_per_node")
    wait_restored(fresh)


def test_a_whole_node_job_that_asks_for_no_gpu_is_capped_on_every_gpu(fresh: WattclassRig) -> None:
    """Slurm gives an --exclusive job every GPU of its node though it asks for none
    (_handle_exclusive_gres): job_submit.lua decides it (no placement features: it may be a CPU
    job), and the Prolog caps every GPU it got."""
    job_id, job = run_job(fresh, "-J", "mem-train", "--exclusive")
    assert job["admin_comment"] == MEM and not job.get("features"), job
    seen, gpus = fresh.seen(job_id)
    assert len(gpus) == len(seen) > 1, (gpus, seen)  # every GPU of the node
    assert set(seen.values()) == {420.0}, seen
    wait_restored(fresh)


@contextlib.contextmanager
def verbose_ctld(c: SlurmCluster) -> Iterator[None]:
    """slurmctld at the verbose level, where job_submit.lua writes one line per job."""
    subprocess.run(["scontrol", "setdebug", "verbose"], env=c.env, check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["scontrol", "setdebug", "info"], env=c.env, check=True, timeout=30)


def test_job_without_gpus_gets_no_decision(fresh: WattclassRig) -> None:
    with verbose_ctld(fresh.cluster):
        job_id = fresh.cluster.sbatch("-o", "/dev/null", "-J", "mem-train", "-H")
    try:
        job = fresh.cluster.job(job_id)
        assert not job.get("admin_comment") and not job.get("features")
    finally:
        subprocess.run(["scancel", job_id], env=fresh.cluster.env, check=False, timeout=30)
    log = (fresh.root / "log" / "slurmctld.log").read_text()
    assert "unchanged: no_gpu_request" in log


def test_per_job_lines_stay_out_of_the_info_log(fresh: WattclassRig) -> None:
    """A log line costs slurmctld ~35 us of the submission (docs/benchmarks.md): at the default
    info level job_submit.lua writes none per job; admin_comment records the decision."""
    log = fresh.root / "log" / "slurmctld.log"
    before = log.stat().st_size
    job_id = fresh.cluster.sbatch("-o", "/dev/null", "-J", "mem-train", "-H", "--gres=gpu:1")
    try:
        assert fresh.cluster.job(job_id)["admin_comment"] == MEM
    finally:
        subprocess.run(["scancel", job_id], env=fresh.cluster.env, check=False, timeout=30)
    with log.open(errors="replace") as fh:
        fh.seek(before)
        assert "wattclass: job name=" not in fh.read()


def test_huge_job_name_adds_little_to_slurmctld_log(fresh: WattclassRig) -> None:
    c = fresh.cluster
    log = fresh.root / "log" / "slurmctld.log"
    before = log.stat().st_size
    with verbose_ctld(c):  # where the per-job line is written
        for _ in range(5):  # job_submit.lua sees the name; Slurm 22.05 then rejects it as too long
            subprocess.run(["sbatch", "-o", "/dev/null", "-H", "--gres=gpu:1", "-J", "%" * 100_000],
                           input="#!/bin/sh\ntrue\n", env=c.env, capture_output=True, text=True, timeout=30)
    grown = log.stat().st_size - before
    assert grown < 5 * 3000, grown  # was 400 KB per submission
    tail = log.read_text(errors="replace")[-5 * 3000:]
    assert tail.count("...(100000 bytes)") == 5


@pytest.fixture(scope="module")
def debug_default_rig() -> Iterator[WattclassRig]:
    """A second cluster whose DEFAULT partition (debug) is exempt."""
    require_daemons()
    root = Path(tempfile.mkdtemp(prefix="wattclass-slurm-dd-"))
    r = WattclassRig(root, sys.executable, default_partition="debug")
    write_table(r)
    start_rig_or_skip(r)
    yield r
    r.cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_job_without_partition_in_exempt_default_partition_is_exempt(debug_default_rig: WattclassRig) -> None:
    rig = debug_default_rig
    job_id, job = run_job(rig, "-J", "mem-train", "--gres=gpu:1")
    assert job["partition"] == "debug" and not job.get("admin_comment")
    assert_uncapped(rig, job_id, job)
    job_id, job = run_job(rig, "-J", "mem-train", "--gres=gpu:1", "-p", "main")
    assert job["admin_comment"] == MEM
    wait_restored(rig)


@pytest.fixture(scope="module")
def two_types_rig() -> Iterator[WattclassRig]:
    """A cluster whose node has two GPU types: ta (Slurm GPUs 0-1) and tb (2-3)."""
    require_daemons()
    root = Path(tempfile.mkdtemp(prefix="wattclass-slurm-tt-"))
    r = WattclassRig(root, sys.executable, gpu_types=("ta", "tb"))
    write_table(r)
    start_rig_or_skip(r)
    yield r
    r.cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("gpus", [["--gres=gpu:ta:1,gpu:tb:1"], ["--gpus=ta:1,tb:1"]])
def test_a_job_of_two_gpu_types_is_capped_on_both(two_types_rig: WattclassRig, gpus: list[str]) -> None:
    """slurmd's Prolog gets SLURM_JOB_GPUS of the last GPU type only (recorded on 25.11:
    SLURM_JOB_GPUS=2 for gres_detail gpu:ta:1(IDX:0),gpu:tb:1(IDX:2)): the ta GPU ran uncapped
    until the Prolog asked Slurm for the whole allocation."""
    rig = two_types_rig
    wait_quiet(rig)
    job_id, job = run_job(rig, "-J", "mem-train", *gpus)
    assert job["admin_comment"] == MEM
    seen, _ = rig.seen(job_id)
    capped = sorted(j for j, w in seen.items() if w == 420.0)
    assert len(capped) == 2 and capped[0] in (0, 1) and capped[1] in (2, 3), seen
    assert all(w == 700.0 for j, w in seen.items() if j not in capped), seen
    wait_restored(rig)
    assert not any(rig.jobs_dir.rglob("*.json"))


def test_job_file_of_an_ended_job_no_longer_holds_the_gpu_uncapped(fresh: WattclassRig) -> None:
    """A job whose Epilog never ran (slurmd killed mid-job) leaves its job files. They used to
    count as a live uncapped neighbour, so every later job on that GPU ran uncapped. Now the
    Prolog asks Slurm and drops every job that does not run on this node -- one slurmctld never
    knew, one COMPLETED, one pending (as a job requeued after a node failure is: same id, still
    known) -- removing its files from every GPU; a job that runs here keeps its place."""
    from wattclass.jobmap import JobAssignment, write_job_file

    c = fresh.cluster
    uuids = [g.uuid for g in fresh.backend.gpus()]
    held = _held(fresh, "root", "-J", "other", "--gres=gpu:1")
    running = c.sbatch("-o", "/dev/null", "-J", "other", "--gres=gpu:1", script="#!/bin/sh\nsleep 120\n")
    try:
        c.wait_job(running, states=("RUNNING",))
        for u in uuids:
            write_job_file(fresh.jobs_dir, u, JobAssignment("987654", "ghost", 4242))
            write_job_file(fresh.jobs_dir, u, JobAssignment(held, "root", 0))
        job_id, _job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1")
        seen, gpus = fresh.seen(job_id)
        assert [seen[g] for g in gpus] == [420.0], seen  # capped: both were dropped
        log = fresh.log.read_text()
        for gone in ("987654", held):
            assert f"job {gone} no longer runs on this node" in log
            assert not any(fresh.jobs_dir.rglob(f"{gone}.json"))  # from every GPU, not only the job's
        wait_restored(fresh)
        # a COMPLETED job is dropped too; the job running here keeps holding the GPU uncapped
        done = job_id
        for u in uuids:
            write_job_file(fresh.jobs_dir, u, JobAssignment(running, "root", 0))
            write_job_file(fresh.jobs_dir, u, JobAssignment(done, "root", 0))
        job_id, _job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1")
        seen, gpus = fresh.seen(job_id)
        assert [seen[g] for g in gpus] == [700.0], seen
        log = fresh.log.read_text()
        assert f"job {done} no longer runs on this node" in log
        assert f"job {running} no longer runs" not in log
    finally:
        for j in (held, running):
            subprocess.run(["scancel", j], env=c.env, check=False, timeout=30)
        with contextlib.suppress(AssertionError):
            c.wait_job(running, states=("CANCELLED",))
        # the planted files, and a record that keeps the cancelled running job on its GPU; the
        # cancelled job's Epilog may remove some of them meanwhile (Slurm says CANCELLED before
        # the node has finished completing the job)
        for p in [*fresh.jobs_dir.rglob("*.json"), *fresh.caps_dir.glob("*.json")]:
            p.unlink(missing_ok=True)
        wait_restored(fresh)


@pytest.mark.parametrize("args", [["--ntasks-per-gpu=1", "-n", "2"], ["--ntasks-per-gpu=2", "-n", "2"]])
def test_gpus_implied_by_ntasks_per_gpu_are_decided_and_capped(fresh: WattclassRig, args: list[str]) -> None:
    """``--ntasks-per-gpu=N -n M`` names no GPU field, yet slurmctld gives the job M/N GPUs
    (gres_job_state_validate derives ``gres/gpu:M/N`` from the task count): read as no GPU request
    it ran a memory job on its GPUs uncapped, a cap escape open to every user."""
    job_id, job = run_job(fresh, "-J", "mem-train", *args)
    seen, gpus = fresh.seen(job_id)
    assert gpus, "Slurm gave the job GPUs"
    assert job["admin_comment"] == MEM
    assert [seen[g] for g in gpus] == [420.0] * len(gpus)
    wait_restored(fresh)



def test_exempt_partition_that_sends_jobs_to_its_alternate_is_no_exemption(fresh: WattclassRig) -> None:
    """A partition that takes no submissions (State=DRAIN or INACTIVE) hands a job submitted to it
    to its ``Alternate=`` partition (slurmctld's _alt_part_test, after job_submit): a memory job
    submitted to the drained exempt partition ran in the capped one, uncapped."""
    c = fresh.cluster
    c.run(["scontrol", "update", "PartitionName=debug", "State=DRAIN", "Alternate=main"])
    try:
        job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1", "-p", "debug")
        assert job["partition"] == "main"
        assert job["admin_comment"] == MEM
        seen, gpus = fresh.seen(job_id)
        assert [seen[g] for g in gpus] == [420.0]
    finally:
        c.run(["scontrol", "update", "PartitionName=debug", "State=UP", "Alternate=NONE"])
    wait_restored(fresh)


def test_a_job_without_a_partition_is_judged_by_its_reservations_partition(fresh: WattclassRig) -> None:
    """A job that names no partition but a reservation runs in the reservation's partition, not the
    default one (slurmctld's _get_job_parts): an exempt reservation partition was judged as the
    default (here a benchmark in exempt debug was capped; with an exempt default partition and a
    capped reservation partition, a memory job ran uncapped)."""
    c = fresh.cluster
    c.run(["scontrol", "create", "reservation", "ReservationName=wcbench", "StartTime=now",
           "Duration=10", "Users=root", "PartitionName=debug", "Nodes=ALL", "Flags=IGNORE_JOBS"])
    try:
        job_id, job = run_job(fresh, "-J", "mem-train", "--gres=gpu:1", "--reservation=wcbench")
        assert job["partition"] == "debug"
        assert not job.get("admin_comment")
        assert_uncapped(fresh, job_id, job)
    finally:
        c.run(["scontrol", "delete", "ReservationName=wcbench"])
    wait_restored(fresh)
