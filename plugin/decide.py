"""What job_submit.lua decides for a job, mirrored in Python.

``wattclass policy explain`` and the demo need the submission decision without a slurmctld, and
a second implementation is only safe if it provably agrees: tests/test_plugin_decide.py runs the
same cases through lua5.1 (the real job_submit.lua) and through ``decide`` and asserts identical
results. Keep the two in step: same order of checks, same reason codes, same admin_comment text.

Order: only jobs that request a GPU (``requests_gpu``), then exempt user, exempt account, exempt
partition (only when EVERY partition of a comma list is exempt: the job may run in any of them),
then the most specific label key (user + job name, user, account) whose confidence reaches its
label's threshold (``policy.min_confidence_by_label`` for that label, else ``min_confidence``; a
less confident key falls through to the next one), the policy's decision for the label, then
shadow vs enforce. Features are added only in enforce mode, only when the user gave no
constraint, and only those the table lists as existing on some node. With a canary
(``policy.canary_threshold`` > 0) a capped decision also gets an arm
(``wattclass.admincomment.canary_arm``, keyed by user + UTC day of submission ``submit_s``).

The caller resolves Slurm's defaults first, as job_submit.lua does: no partition means the
cluster's default partition; no account means the user's default account (from accounting).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from wattclass.admincomment import COMMENT_PREFIX, canary_arm, canary_key, format_comment
from wattclass.labeltable import slurm_account


class Decision(NamedTuple):
    """The outcome for one job: ``status`` is "enforce", "shadow" or "none"; ``reason`` a code."""

    status: str
    reason: str
    label: str | None = None
    confidence: float | None = None
    source: str | None = None
    key: str | None = None  # which table level matched: user_name, user, account
    cap: str | None = None
    features: str | None = None  # what job_submit.lua adds to the job's constraints
    admin_comment: str | None = None
    #: The confidence the matched key's label needed (its per-label threshold or min_confidence).
    min_confidence: float | None = None


#: The job fields that can ask for GPUs (job_submit.lua's GPU_FIELDS); ``gres`` is the old alias.
GPU_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket", "gres")


def gpu_count(item: str) -> int | float | None:
    """GPUs one gres/TRES item asks for; None when it is not a GPU item.

    Every spelling Slurm uses: "gpu:2", "gres:gpu:2" (22.05), "gres/gpu:2" (25.11), typed
    "gres/gpu:h200:2", bare "gpu", "gres/gpu=2". A type without a count means 1. Shares of a GPU
    (gres/shard, gres/mps) count too: the Prolog caps the GPU they share. Mirrors Lua.
    """
    s = item[5:] if item[:5] in ("gres:", "gres/") else item
    cuts = [i for i in (s.find(":"), s.find("=")) if i >= 0]
    cut = min(cuts) if cuts else None
    if (s if cut is None else s[:cut]) not in ("gpu", "shard", "mps"):
        return None
    if cut is None:
        return 1
    last = s[cut + 1:].rsplit(":", 1)[-1]
    return _lua_number(last) if _lua_number(last) is not None else 1


def _lua_number(text: str) -> float | None:
    """Lua 5.1 ``tonumber`` (strtod: decimal, exponent, inf/nan, 0x hex), enough for a count's sign."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return float(int(text.strip(), 16)) if text.strip().lower().startswith(("0x", "-0x")) else None
    except ValueError:
        return None


def requests_gpu(specs: Iterable[str | None]) -> bool:
    """True when any spec (tres_per_node, tres_per_job, ...; comma lists) asks for a GPU."""
    for spec in specs:
        if spec:
            for item in spec.split(","):
                n = gpu_count(item)
                if n is not None and n > 0:
                    return True
    return False


#: Slurm's "unset" for a 16-bit job field such as ntasks_per_tres.
NO_VAL16 = 65534


def tasks_per_gpu_set(ntasks_per_tres: object) -> bool:
    """Whether ``--ntasks-per-gpu`` (job_desc ``ntasks_per_tres``) is set, which gives a job GPUs
    without any GPU field: slurmctld derives ``gres/gpu:<tasks / ntasks_per_tres>``
    (gres_job_state_validate, 22.05 to 25.11). Read as no GPU request, such a job ran uncapped.
    Mirrors job_submit.lua's ``tasks_per_gpu_set``."""
    if isinstance(ntasks_per_tres, bool) or not isinstance(ntasks_per_tres, int | float):
        return False
    return 0 < ntasks_per_tres != NO_VAL16


def threshold(policy: Mapping[str, Any], label: object) -> float:
    """The confidence a key labelled ``label`` needs: its per-label threshold, else min_confidence."""
    by_label = policy.get("min_confidence_by_label") or {}
    value = by_label.get(label) if isinstance(label, str) else None
    return float(value) if value is not None else float(policy.get("min_confidence", 1.0))


def _lookup(table: Mapping[str, Any], user: str | None, name: str | None, account: str | None,
            policy: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], bool] | None:
    """(key, record, low): the most specific key reaching its label's threshold, else the most
    specific found."""
    cands: list[tuple[str, Any]] = []
    if user is not None and name is not None:
        cands.append(("user_name", ((table.get("by_user_name") or {}).get(user) or {}).get(name)))
    if user is not None:
        cands.append(("user", (table.get("by_user") or {}).get(user)))
    if account is not None:
        cands.append(("account", (table.get("by_account") or {}).get(account)))
    low: tuple[str, Mapping[str, Any], bool] | None = None
    for key, rec in cands:
        if isinstance(rec, Mapping):
            if float(rec.get("confidence", 0.0)) >= threshold(policy, rec.get("label")):
                return key, rec, False
            if low is None:
                low = (key, rec, True)
    return low


def decide(
    table: Mapping[str, Any] | None,
    user: str | None,
    name: str | None,
    account: str | None = None,
    partition: str | None = None,
    user_features: str | None = None,
    gpu_request: bool | str = True,
    submit_s: int | None = None,
) -> Decision:
    """The decision job_submit.lua makes for a job with these (resolved) fields; see module docstring.

    ``gpu_request="whole_node"``: the job asks for no GPU but gets all of its nodes' (``--exclusive``,
    an OverSubscribe=EXCLUSIVE partition): it is decided, without placement features."""
    if not isinstance(table, Mapping) or not isinstance(table.get("policy"), Mapping):
        return Decision("none", "no_table")
    if not gpu_request:
        return Decision("none", "no_gpu_request")
    policy: Mapping[str, Any] = table["policy"]
    exempt = policy.get("exempt") or {}
    if account is not None:  # as job_submit.lua: Slurm lower-cases it after job_submit (C tolower)
        account = slurm_account(account)
    if user is not None and (exempt.get("users") or {}).get(user):
        return Decision("none", "exempt_user")
    if account is not None and (exempt.get("accounts") or {}).get(account):
        return Decision("none", "exempt_account")
    parts = [p for p in (partition or "").split(",") if p]
    if parts and all((exempt.get("partitions") or {}).get(p) for p in parts):
        return Decision("none", "exempt_partition")
    hit = _lookup(table, user, name, account, policy)
    if hit is None:
        return Decision("none", "unknown_job")
    key, rec, low = hit
    label, conf, src = str(rec.get("label")), float(rec.get("confidence", 0.0)), str(rec.get("source", ""))
    need = threshold(policy, label)
    if low:
        return Decision("none", "low_confidence", label, conf, src, key, min_confidence=need)
    dec = (policy.get("decisions") or {}).get(label)
    if not isinstance(dec, Mapping):
        return Decision("none", "no_decision", label, conf, src, key, min_confidence=need)
    cap = dec.get("cap")
    mode = "shadow" if policy.get("mode") != "enforce" else "enforce"
    arm = None
    if cap:
        now = int(time.time()) if submit_s is None else int(submit_s)
        arm = canary_arm(int(policy.get("canary_threshold") or 0), mode, canary_key(user, now))
    comment = format_comment(label, conf, cap, src, mode, arm)
    features = None
    if mode == "enforce" and not user_features and gpu_request is True:
        avail = policy.get("features_available") or {}
        feats = [f for f in (dec.get("features") or []) if avail.get(f)]
        features = "&".join(feats) if feats else None
    return Decision(mode, mode, label, conf, src, key, cap=cap, features=features, admin_comment=comment,
                    min_confidence=need)


__all__ = ["COMMENT_PREFIX", "Decision", "decide", "format_comment", "threshold"]
