"""Policy validation (errors name file and key), cap arithmetic, and the CLI around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wattclass.cli import main
from wattclass.errors import ConfigError
from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import Cap, cap_watts, load_policy, parse_cap

GOOD = """
mode = "enforce"
min_confidence = 0.8
[caps]
compute = "100%"
memory = "60%"
mixed = "450W"
idle = "300W"
[placement.memory]
features = ["hbm"]
[exempt]
accounts = ["benchmark"]
partitions = ["debug"]
users = []
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(text)
    return p


def test_good_policy_and_table_dict(tmp_path: Path) -> None:
    pol = load_policy(_write(tmp_path, GOOD))
    assert pol.caps["memory"] == Cap(60.0, "%") and pol.caps["idle"] == Cap(300.0, "W")
    d = pol.table_dict({"hbm"})
    assert d["decisions"]["memory"] == {"cap": "60%", "features": ["hbm"]}
    assert d["decisions"]["mixed"]["cap"] == "450W"
    assert d["exempt"] == {"accounts": {"benchmark": True}, "partitions": {"debug": True}, "users": {}}
    assert pol.table_dict(set())["decisions"]["memory"]["features"] == []  # feature on no node


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('mode = "enforce"\nbogus = 1\n', "bogus"),
        ('mode = "yes"\n', "mode"),
        ("min_confidence = 1.5\n", "min_confidence"),
        ('min_confidence = "high"\n', "min_confidence"),
        ('[caps]\nmemory = "60%"\nfoo = "50%"\n', "caps.foo"),
        ('[caps]\nmemory = "160%"\n', "caps.memory"),
        ('[caps]\nmemory = "-5W"\n', "caps.memory"),
        ("[caps]\nmemory = true\n", "caps.memory"),
        ('[caps]\nmemory = "fast"\n', "caps.memory"),
        ('[placement.memory]\nfeatures = "hbm"\n', "placement.memory.features"),
        ("[placement.memory]\nfeatures = [1]\n", "placement.memory.features"),
        ('[placement.memory]\nfeatures = ["a b"]\n', "placement.memory.features"),
        ('[placement.memory]\nfeature = ["hbm"]\n', "placement.memory"),
        ('[placement.gpu]\nfeatures = ["hbm"]\n', "placement.gpu"),
        ('[exempt]\naccounts = "benchmark"\n', "exempt.accounts"),
        ('[exempt]\ngroups = ["x"]\n', "groups"),
        ("mode = \n", "not valid TOML"),
        ("[canary]\nfraction = 0.9\n", "canary.fraction"),
        ("[canary]\nfraction = true\n", "canary.fraction"),
        ("[canary]\nshare = 0.1\n", "canary: unknown key 'share'"),
        ("canary = 0.1\n", "canary: expected a table"),
    ],
)
def test_bad_policy_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(path) in str(err.value) and key in str(err.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_policy(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("cap", "expect"),
    [("60%", 420.0), ("10%", 200.0), ("350W", 350.0), ("350 w", 350.0), ("900W", 700.0), ("100%", 700.0)],
)
def test_cap_watts_clamped_to_min_max(cap: object, expect: float) -> None:
    assert cap_watts(parse_cap(cap), 700.0, 200.0, 700.0) == expect


def test_policy_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, GOOD)
    assert main(["policy", "check", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decisions"]["memory"]["cap"] == "60%"
    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "loud"\n')
    assert main(["policy", "check", str(bad)]) == 2
    assert "mode" in capsys.readouterr().err


def test_policy_explain_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, GOOD)
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user_name", "alice", "train.sh", None, "memory", 0.93, 4, "rule"),
                              TableEntry("user", "alice", None, None, "compute", 0.6, 9, "rule")],
                      {"features_available": {"hbm": True}})
    args = ["policy", "explain", "--policy", str(good), "--table", str(table), "--user", "alice"]
    assert main([*args, "--name", "train.sh", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["cap"], out["features"], out["key"]) == ("enforce", "60%", "hbm", "user_name")
    assert main([*args, "--name", "other", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "low_confidence"
    assert main([*args, "--name", "train.sh", "--account", "benchmark"]) == 0
    assert "account is exempt" in capsys.readouterr().out


# -- issue 9 item 9: a cap needs a unit and a sane range --------------------------------------------
@pytest.mark.parametrize("cap", ["0.6", 0.6, "60", 60, 350, "5W", "5%", "9.9%", "101%", "2001W", "45 W",
                                 "60 %%", "1e3W", "inf%", "nan%", ""])
def test_caps_need_a_unit_and_a_sane_range(tmp_path: Path, cap: object) -> None:
    value = f'"{cap}"' if isinstance(cap, str) else str(cap)
    path = _write(tmp_path, f"[caps]\nmemory = {value}\n")
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(path) in str(err.value) and "caps.memory" in str(err.value)
    assert main(["policy", "check", str(path)]) == 2


@pytest.mark.parametrize("cap", ["10%", "100%", "50W", "2000W", "350 w", "62.5%"])
def test_sane_caps_pass(tmp_path: Path, cap: str) -> None:
    assert load_policy(_write(tmp_path, f'[caps]\nmemory = "{cap}"\n')).caps["memory"].text()


def test_policy_explain_shows_the_watts_on_a_gpu_model(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, GOOD)
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user_name", "alice", "train.sh", None, "memory", 0.93, 4, "rule")],
                      {"features_available": {"hbm": True}})
    args = ["policy", "explain", "--policy", str(good), "--table", str(table), "--user", "alice",
            "--name", "train.sh"]
    assert main([*args, "--gpu-model", "H200"]) == 0
    assert "60% sets 420 W" in capsys.readouterr().out
    assert main([*args, "--limits", "400,100,400", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cap_w"] == 240.0
    assert main([*args, "--gpu-model", "Z9"]) == 2
    assert "unknown" in capsys.readouterr().err
    assert main([*args, "--limits", "700,800,900"]) == 2
    assert main([*args, "--no-gpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "no_gpu_request"


@pytest.mark.parametrize("damage", ["group_writable", "owned_by_nobody", "symlink"])
def test_untrusted_policy_is_refused(tmp_path: Path, damage: str) -> None:
    """Issue 9 item 11: a policy another user can change would let them exempt themselves."""
    import os

    path = _write(tmp_path, GOOD)
    path.chmod(0o644)
    if damage == "group_writable":
        path.chmod(0o664)
    elif damage == "owned_by_nobody":
        os.chown(path, 65534, 65534)
    else:
        link = tmp_path / "link.toml"
        link.symlink_to(path)
        path = link
    with pytest.raises(ConfigError, match=str(path)):
        load_policy(path)

def test_canary_fraction_reaches_the_table_as_buckets(tmp_path: Path) -> None:
    pol = load_policy(_write(tmp_path, "[canary]\nfraction = 0.1\n"))
    assert pol.canary_fraction == 0.1 and pol.table_dict()["canary_threshold"] == 1000
    assert load_policy(_write(tmp_path, "")).table_dict()["canary_threshold"] == 0


# -- issue 13: a confidence threshold per label ----------------------------------------------------
PER_LABEL = GOOD.replace("min_confidence = 0.8\n",
                         "min_confidence = 0.8\n[min_confidence_by_label]\nmemory = 0.9\nidle = 0.95\n"
                         "compute = 0.5\n")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[min_confidence_by_label]\ngpu = 0.9\n", "min_confidence_by_label.gpu: unknown label"),
        ("[min_confidence_by_label]\nmemory = 1.2\n", "min_confidence_by_label.memory: expected a number"),
        ("[min_confidence_by_label]\nmemory = -0.1\n", "min_confidence_by_label.memory"),
        ('[min_confidence_by_label]\nmemory = "0.9"\n', "min_confidence_by_label.memory"),
        ("[min_confidence_by_label]\nmemory = true\n", "min_confidence_by_label.memory"),
        ("[min_confidence_by_label]\nmemory = nan\n", "min_confidence_by_label.memory"),
        ("min_confidence_by_label = 0.9\n", "min_confidence_by_label: expected a table"),
        ("[min_confidence_by_label.memory]\nvalue = 0.9\n", "min_confidence_by_label.memory"),
    ],
)
def test_bad_per_label_threshold_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(path) in str(err.value) and key in str(err.value)
    assert main(["policy", "check", str(path)]) == 2


def test_per_label_thresholds_default_to_min_confidence(tmp_path: Path) -> None:
    pol = load_policy(_write(tmp_path, PER_LABEL))
    # below the global one is allowed (compute 0.5): see policy._parse_by_label
    assert pol.effective_thresholds() == {"compute": 0.5, "memory": 0.9, "mixed": 0.8, "idle": 0.95}
    assert pol.table_dict()["min_confidence_by_label"] == {"compute": 0.5, "memory": 0.9, "idle": 0.95}
    plain = load_policy(_write(tmp_path, GOOD))
    assert plain.min_confidence_by_label == {} and set(plain.effective_thresholds().values()) == {0.8}
    inline = load_policy(_write(tmp_path, "min_confidence = 0.7\nmin_confidence_by_label = { memory = 1 }\n"))
    assert inline.threshold("memory") == 1.0 and inline.threshold("idle") == 0.7


def test_per_label_thresholds_round_trip_through_the_table(tmp_path: Path) -> None:
    from test_plugin_decide import lua_table_eval

    from wattclass.labeltable import read_label_table

    entry = [TableEntry("user", "alice", None, None, "memory", 0.93, 4, "rule")]
    table = tmp_path / "labels.tsv"
    write_label_table(table, entry, load_policy(_write(tmp_path, PER_LABEL)).table_dict())
    assert "\nmin_confidence_label\tmemory\t0.9\n" in table.read_text()
    pol = read_label_table(table)["policy"]
    assert (pol["min_confidence"], pol["min_confidence_by_label"]) == (
        0.8, {"compute": 0.5, "memory": 0.9, "idle": 0.95})
    by = "t.policy.min_confidence_by_label"
    assert lua_table_eval(table, f"{by}.compute, {by}.memory, {by}.idle, {by}.mixed, t.policy.min_confidence",
                          tmp_path).split() == ["0.5", "0.9", "0.95", "nil", "0.8"]
    # no per-label threshold: no such line, so a table reads exactly as before (older readers too)
    write_label_table(table, entry, load_policy(_write(tmp_path, GOOD)).table_dict())
    assert "min_confidence_label" not in table.read_text()
    assert read_label_table(table)["policy"]["min_confidence_by_label"] == {}


@pytest.mark.parametrize(("by_label", "match"), [({"fast": 0.9}, "unknown label 'fast'"),
                                                 ({"memory": 1.5}, "not a number in \\[0, 1\\]"),
                                                 ({"memory": float("nan")}, "not a number")])
def test_table_writer_refuses_bad_thresholds(tmp_path: Path, by_label: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        write_label_table(tmp_path / "x.tsv", [], {"mode": "enforce", "min_confidence_by_label": by_label})
    assert not (tmp_path / "x.tsv").exists()


def test_policy_check_and_explain_show_the_thresholds(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, PER_LABEL)
    assert main(["policy", "check", str(path)]) == 0
    assert ("confidence needed to act: compute 0.5 (min_confidence_by_label), memory 0.9 "
            "(min_confidence_by_label), mixed 0.8, idle 0.95 (min_confidence_by_label)"
            ) in capsys.readouterr().out
    assert main(["policy", "check", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["thresholds"]["memory"] == 0.9
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user_name", "alice", "train.sh", None, "memory", 0.85, 4, "rule"),
                              TableEntry("user", "alice", None, None, "compute", 0.6, 9, "model")],
                      {"features_available": {"hbm": True}})
    args = ["policy", "explain", "--policy", str(path), "--table", str(table), "--user", "alice",
            "--name", "train.sh"]
    # memory 0.85 < its 0.9: on to alice's user key, compute 0.6 >= compute's own 0.5
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["label"], out["key"], out["min_confidence"]) == (
        "enforce", "compute", "user", 0.5)
    assert out["thresholds"] == {"compute": 0.5, "memory": 0.9, "mixed": 0.8, "idle": 0.95}
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "label: compute confidence 0.60 from user key (source model); compute needs 0.5 " \
        "(min_confidence_by_label)" in text and "memory 0.9 (min_confidence_by_label)" in text
    # the policy file without per-label thresholds: the memory key decides, needing the global 0.8
    assert main([*args[:3], str(_write(tmp_path, GOOD)), *args[4:]]) == 0
    text = capsys.readouterr().out
    assert "label: memory confidence 0.85 from user_name key (source rule); memory needs 0.8 " \
        "(min_confidence)" in text


@pytest.mark.parametrize(("text", "where"), [
    ('[exempt]\nusers = [" alice"]\n', "exempt.users"),
    ('[exempt]\naccounts = ["ml "]\n', "exempt.accounts"),
    ('[caps]\nmemory = "60%"\n[placement.memory]\nfeatures = ["hbm\\t"]\n', "placement.memory"),
])
def test_a_name_with_white_space_around_it_is_refused(tmp_path: Path, text: str, where: str) -> None:
    """Review finding: " alice" was accepted and never matched a Slurm user, so the exemption the
    admin wrote exempted nobody, silently."""
    with pytest.raises(ConfigError, match=f"{where}.*white space around it"):
        load_policy(_write(tmp_path, text))


@pytest.mark.parametrize(("text", "where"), [
    ('[exempt]\npartitions = ["debug,test"]\n', "exempt.partitions"),
    ('[exempt]\naccounts = ["benchmark,ops"]\n', "exempt.accounts"),
    ('[exempt]\nusers = ["alice,bob"]\n', "exempt.users"),
])
def test_a_comma_separated_list_in_one_name_is_refused(tmp_path: Path, text: str, where: str) -> None:
    """``partitions = ["debug,test"]`` is one name that no partition has (Slurm names hold no
    comma; job_submit.lua compares each partition of the job's -p list), so it exempted nobody and
    ``policy check`` said valid. Now it names the key and the list it meant."""
    with pytest.raises(ConfigError, match=f'{where}: .* holds a comma.*one name per string: \\["'):
        load_policy(_write(tmp_path, text))


@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_policy_explain_first_line_says_whether_the_prolog_caps(tmp_path: Path, mode: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """With a canary the arm, not the mode, decides the cap: the decision line (and ``why`` in
    --json) said "shadow mode: ... nothing changes" for a shadow job in the capped arm and "the
    Prolog caps the job's GPUs" for an enforce job in the control arm, the opposite of what the
    Prolog does, on the one line an admin reads to decide the rollout."""
    from wattclass.admincomment import parse_admin_comment

    text = GOOD.replace('mode = "enforce"', f'mode = "{mode}"') + "[canary]\nfraction = 0.5\n"
    pol = _write(tmp_path, text)
    users = [f"user{i}" for i in range(40)]
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", u, None, None, "memory", 0.93, 4, "rule") for u in users],
                      {"features_available": {}})
    seen = set()
    for user in users:
        args = ["policy", "explain", "--policy", str(pol), "--table", str(table), "--user", user,
                "--name", "x"]
        assert main([*args, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        capped = parse_admin_comment(out["admin_comment"]).capped_for_real()  # type: ignore[union-attr]
        seen.add(capped)
        assert ("not capped" in out["why"]) != capped, out
        assert main(args) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert ("not capped" in first) != capped, first
    assert seen == {True, False}  # both arms were met


@pytest.mark.parametrize(("mode", "fraction", "says"), [
    ("shadow", 0.1, "10% of capped decisions capped for real"),
    ("enforce", 0.05, "5% of capped decisions left uncapped (control arm)"),
    ("shadow", 0.0, "canary: none"),
])
def test_policy_check_says_what_the_canary_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                mode: str, fraction: float, says: str) -> None:
    """Rollout steps 4 and 5 turn on [canary] fraction, whose meaning flips with the mode (capped
    in shadow, the uncapped control in enforce); `policy check` printed neither the fraction nor
    what it does, so a typo'd section name or a fraction left at 0 passed unnoticed."""
    text = GOOD.replace('mode = "enforce"', f'mode = "{mode}"') + f"[canary]\nfraction = {fraction}\n"
    path = _write(tmp_path, text)
    assert main(["policy", "check", str(path)]) == 0
    assert says in capsys.readouterr().out
    assert main(["policy", "check", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["canary_fraction"] == fraction


def test_policy_explain_says_when_the_table_in_use_has_another_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """explain answers from the policy file, but job_submit.lua decides from the table's copy,
    written by the last successful nightly run. Rolling back (mode -> shadow) before a nightly run
    that rewrites the table (or after one that exited 7), explain said "shadow ... not capped"
    while every new job was still enforced. It now names what differs in the table in use."""
    from wattclass.policy import load_policy

    enforce = _write(tmp_path, GOOD)
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user", "alice", None, None, "memory", 0.93, 4, "rule")],
                      load_policy(enforce).table_dict())
    args = ["policy", "explain", "--policy", str(enforce), "--table", str(table), "--user", "alice",
            "--name", "x"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["table_policy_differs"] == []
    shadow = tmp_path / "shadow.toml"
    shadow.write_text(GOOD.replace('mode = "enforce"', 'mode = "shadow"'))
    args[3] = str(shadow)
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["table_policy_differs"] == ["mode"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "mode enforce" in out and str(table) in out and "nightly" in out, out


def test_policy_apply_rewrites_the_tables_policy_now_keeping_its_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rolling back meant a whole nightly run to rewrite the table, and that run leaves the old
    (enforce) table in place when the day has no usable telemetry (exit 7), its windows are all
    rejected (3) or the lock is held (6). `policy apply` writes the policy file into the table at
    once: same keys, same owner, group and mode, atomically; a policy that fails its checks
    changes nothing."""
    import grp
    import os

    from wattclass.labeltable import read_label_table
    from wattclass.policy import load_policy

    enforce = _write(tmp_path, GOOD)
    table = tmp_path / "labels.tsv"
    entries = [TableEntry("user_name", "alice", "train.sh", None, "memory", 0.93, 4, "rule"),
               TableEntry("account", None, None, "physics", "compute", 0.85, 9, "rule")]
    gid = grp.getgrnam("nogroup").gr_gid
    write_label_table(table, entries, load_policy(enforce).table_dict({"hbm"}), group=gid)
    before = read_label_table(table)
    shadow = tmp_path / "shadow.toml"
    shadow.write_text(GOOD.replace('mode = "enforce"', 'mode = "shadow"'))
    assert main(["policy", "apply", "--policy", str(shadow), "--table", str(table)]) == 0
    out = capsys.readouterr().out
    assert "shadow" in out and "enforce" in out and str(table) in out, out
    after = read_label_table(table)
    assert after["policy"]["mode"] == "shadow"
    assert {k: v for k, v in after.items() if k not in ("policy", "generated_at")} == \
        {k: v for k, v in before.items() if k not in ("policy", "generated_at")}
    assert after["policy"]["features_available"] == {"hbm": True}  # sinfo's answer kept
    st = os.stat(table)
    assert (st.st_mode & 0o777, st.st_gid) == (0o640, gid)
    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "enforce"\n[caps]\nmemory = 0.6\n')
    text = table.read_text()
    assert main(["policy", "apply", "--policy", str(bad), "--table", str(table)]) == 2
    assert table.read_text() == text


def test_policy_apply_names_a_missing_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rollback given a table path that is not there (a typo, the table moved away to stop
    deciding) ended in a FileNotFoundError traceback, exit 1 (found by the session review). Now a
    usage error naming --table and the path, and no file is made there."""
    pol = _write(tmp_path, GOOD)
    table = tmp_path / "labels.tsv"
    assert main(["policy", "apply", "--policy", str(pol), "--table", str(table)]) == 2
    err = capsys.readouterr().err
    assert "--table" in err and str(table) in err and "Traceback" not in err, err
    assert not table.exists()
    long = tmp_path / ("x" * 300)  # another OSError (ENAMETOOLONG): named too
    assert main(["policy", "apply", "--policy", str(pol), "--table", str(long)]) == 2
    assert "--table" in capsys.readouterr().err


def test_policy_apply_waits_while_a_nightly_run_writes_the_table(tmp_path: Path) -> None:
    """`policy apply` and the nightly's table write take the table's write lock: a rollback
    applied while a run writes the table is written after it (and the run reads the policy file
    inside the lock: test_nightly_writes_the_policy_file_as_it_is_at_the_table_write). Without
    the lock the two could interleave, the run's write landing last with the old policy."""
    import threading

    from wattclass.labeltable import read_label_table, table_write_lock
    from wattclass.policy import load_policy

    enforce = _write(tmp_path, GOOD)
    table = tmp_path / "labels.tsv"
    write_label_table(table, [TableEntry("user_name", "alice", "train.sh", None, "memory", 0.93, 4, "rule")],
                      load_policy(enforce).table_dict(set()))
    shadow = tmp_path / "shadow.toml"
    shadow.write_text(GOOD.replace('mode = "enforce"', 'mode = "shadow"'))
    rcs: list[int] = []
    apply = threading.Thread(target=lambda: rcs.append(
        main(["policy", "apply", "--policy", str(shadow), "--table", str(table)])))
    with table_write_lock(table):  # a nightly run writing the table
        apply.start()
        apply.join(1.0)
        assert apply.is_alive() and rcs == []  # waiting for the lock, nothing written
        assert read_label_table(table)["policy"]["mode"] == "enforce"
    apply.join(30)
    assert rcs == [0] and read_label_table(table)["policy"]["mode"] == "shadow"
