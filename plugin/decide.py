"""What job_submit.lua decides for a job, mirrored in Python.

``wattclass policy explain`` and the demo need the submission decision without a slurmctld, and
a second implementation is only safe if it provably agrees: tests/test_plugin_decide.py runs the
same cases through lua5.1 (the real job_submit.lua) and through ``decide`` and asserts identical
results. Keep the two in step: same order of checks, same reason codes, same admin_comment text.

Order: exempt user, exempt account, exempt partition (any of a comma list), then the most specific
label key (user + job name, user, account), minimum confidence, the policy's decision for the
label, then shadow vs enforce. Features are added only in enforce mode, only when the user gave
no constraint, and only those the table lists as existing on some node.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from wattclass.admincomment import COMMENT_PREFIX, canary_arm, canary_key, format_comment


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


def _lookup(table: Mapping[str, Any], user: str | None, name: str | None,
            account: str | None) -> tuple[str, Mapping[str, Any]] | None:
    if user is not None and name is not None:
        rec = (table.get("by_user_name") or {}).get(user, {}).get(name)
        if isinstance(rec, Mapping):
            return "user_name", rec
    if user is not None:
        rec = (table.get("by_user") or {}).get(user)
        if isinstance(rec, Mapping):
            return "user", rec
    if account is not None:
        rec = (table.get("by_account") or {}).get(account)
        if isinstance(rec, Mapping):
            return "account", rec
    return None


def decide(
    table: Mapping[str, Any] | None,
    user: str | None,
    name: str | None,
    account: str | None = None,
    partition: str | None = None,
    user_features: str | None = None,
    submit_s: int | None = None,
) -> Decision:
    """The decision job_submit.lua makes for a job with these fields (see module docstring)."""
    if not isinstance(table, Mapping) or not isinstance(table.get("policy"), Mapping):
        return Decision("none", "no_table")
    policy: Mapping[str, Any] = table["policy"]
    exempt = policy.get("exempt") or {}
    if user is not None and (exempt.get("users") or {}).get(user):
        return Decision("none", "exempt_user")
    if account is not None and (exempt.get("accounts") or {}).get(account):
        return Decision("none", "exempt_account")
    if partition is not None:
        for part in partition.split(","):
            if (exempt.get("partitions") or {}).get(part):
                return Decision("none", "exempt_partition")
    hit = _lookup(table, user, name, account)
    if hit is None:
        return Decision("none", "unknown_job")
    key, rec = hit
    label, conf, src = str(rec.get("label")), float(rec.get("confidence", 0.0)), str(rec.get("source", ""))
    if conf < float(policy.get("min_confidence", 1.0)):
        return Decision("none", "low_confidence", label, conf, src, key)
    dec = (policy.get("decisions") or {}).get(label)
    if not isinstance(dec, Mapping):
        return Decision("none", "no_decision", label, conf, src, key)
    cap = dec.get("cap")
    mode = "shadow" if policy.get("mode") != "enforce" else "enforce"
    arm = None
    if cap:
        now = int(time.time()) if submit_s is None else int(submit_s)
        arm = canary_arm(int(policy.get("canary_threshold") or 0), mode, canary_key(user, name, now))
    comment = format_comment(label, conf, cap, src, mode, arm)
    features = None
    if mode == "enforce" and not user_features:
        avail = policy.get("features_available") or {}
        feats = [f for f in (dec.get("features") or []) if avail.get(f)]
        features = "&".join(feats) if feats else None
    return Decision(mode, mode, label, conf, src, key, cap=cap, features=features, admin_comment=comment)


__all__ = ["COMMENT_PREFIX", "Decision", "decide", "format_comment"]
