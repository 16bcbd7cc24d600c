"""Condense the label history into submission-time table entries (keys user+name, user, account).

Aggregation policy (our choice): a *recency- and confidence-weighted vote*. Each past job votes for
its label with weight ``confidence * 0.5 ** (age_days / HALF_LIFE_DAYS)``; the key's label is the
heaviest label and its confidence is ``W_label / (W_all + PRIOR_WEIGHT)``. The prior term is a
pseudo-vote for "unknown": one confident job gives ~0.65, three agreeing jobs ~0.85, so a key earns
the policy's usual 0.8 only with repeated, consistent evidence, and a user who changes habits
switches label within about a half-life. Unlabelled jobs never vote. ``source`` is ``rule`` when
most of the key's jobs were labelled by the GPM rule, else ``model``.

The model's ambiguity check (issue 13 round 6) lowers some jobs' confidence; it must only make a
key less sure, never change what it says. So the heaviest label and ``W_all`` come from each job's
confidence *before* the check (labels' ``confidence_unchecked``), and only ``W_label`` from the
checked one. A key the check makes unsure falls through to the broader keys, as any key below the
policy's min_confidence does (a new job name, a changed habit): the job then gets what the user's
or account's history says, not a guess of its own (docs/design.md, "Submission-time label table").

``lookup`` mirrors job_submit.lua's order (most specific key first) for the replay evaluation.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from wattclass.errors import WattclassError
from wattclass.labeltable import LABELS, Level, TableEntry
from wattclass.logsafe import clip

log = logging.getLogger("wattclass.classifier")

HALF_LIFE_DAYS = 14.0
PRIOR_WEIGHT = 0.5
HISTORY_DAYS = 120


def build_entries(history: pd.DataFrame, now: dt.datetime) -> list[TableEntry]:
    """Entries for every key in ``history`` (columns user, name, account, label, confidence, end, source;
    ``confidence_unchecked`` where the labels have it)."""
    if history.empty:
        return []
    h = history[history["label"].isin(LABELS)].copy()
    if h.empty:
        return []
    if "job_id" in h.columns:
        # One vote per job: a job that ran across midnight has windows in two date= partitions and
        # a label of each night; counted twice, one job could lift its key to the policy's
        # threshold. The night that saw most of its windows speaks for it (ties: the newer one).
        if "n_windows" in h.columns:
            h = h.sort_values("n_windows", kind="stable", na_position="first")
        h = h.drop_duplicates("job_id", keep="last").sort_index()
    end = pd.to_datetime(h["end"], utc=True)
    age_days = np.maximum((pd.Timestamp(now) - end).dt.total_seconds().to_numpy() / 86400.0, 0.0)
    conf = h["confidence"].astype(float).fillna(0.0).to_numpy()
    decay = 0.5 ** (age_days / HALF_LIFE_DAYS)
    h["w"] = np.clip(conf, 0.0, 1.0) * decay
    # The vote's total counts each job at its confidence *before* the model's ambiguity check
    # (labeling.decide): the check lowers a job's own weight, and must not thereby raise the
    # share of the key's other labels (a key of mostly-memory jobs whose compute jobs the check
    # lowered would otherwise move towards a memory cap). Label stores older than the check lack
    # the column: there both are the same.
    if "confidence_unchecked" in h:
        unchecked = h["confidence_unchecked"].astype(float).fillna(h["confidence"].astype(float)).fillna(0.0)
        h["w_all"] = np.clip(np.maximum(unchecked.to_numpy(), conf), 0.0, 1.0) * decay
    else:
        h["w_all"] = h["w"]
    # w_all per label picks the winner (the check never changes a key's label), w its confidence
    h["is_rule"] = h["source"].astype(str).str.startswith("rule").astype(float)  # "rule+shared" too
    entries: list[TableEntry] = []
    levels: list[tuple[Level, list[str]]] = [("user_name", ["user", "name"]), ("user", ["user"]),
                                           ("account", ["account"])]
    for level, keys in levels:
        cols = [k for k in keys if k in h.columns]
        if len(cols) != len(keys):
            continue
        sub = h.dropna(subset=cols)
        sub = sub[(sub[cols].astype(str) != "").all(axis=1)]
        if sub.empty:
            continue
        votes = sub.pivot_table(index=cols, columns="label", values="w", aggfunc="sum", fill_value=0.0)
        votes_all = sub.pivot_table(index=cols, columns="label", values="w_all", aggfunc="sum",
                                    fill_value=0.0).reindex(index=votes.index, columns=votes.columns)
        n = sub.groupby(cols).size()
        rule_share = sub.groupby(cols)["is_rule"].mean()
        total = votes_all.sum(axis=1)
        win = votes_all.idxmax(axis=1)
        wmax = pd.Series([votes.at[k, win[k]] for k in votes.index], index=votes.index)
        for key in votes.index:
            k = key if isinstance(key, tuple) else (key,)
            kd = dict(zip(cols, k, strict=True))
            entries.append(TableEntry(
                level=level,
                user=str(kd["user"]) if "user" in kd else None,
                name=str(kd["name"]) if "name" in kd else None,
                account=str(kd["account"]) if "account" in kd else None,
                label=str(win[key]),
                confidence=float(min(1.0, wmax[key] / (total[key] + PRIOR_WEIGHT))),
                n_jobs=int(n[key]),
                source="rule" if rule_share[key] >= 0.5 else "model",
            ))
    return entries


def index_entries(entries: Iterable[TableEntry]) -> dict[tuple[Any, ...], TableEntry]:
    out: dict[tuple[Any, ...], TableEntry] = {}
    for e in entries:
        if e.level == "user_name":
            out[("user_name", e.user, e.name)] = e
        elif e.level == "user":
            out[("user", e.user)] = e
        else:
            out[("account", e.account)] = e
    return out


def lookup(
    index: dict[tuple[Any, ...], TableEntry], user: str | None, name: str | None, account: str | None,
    min_confidence: float = 0.0,
) -> TableEntry | None:
    """The most specific entry for a new job whose confidence reaches ``min_confidence``."""
    for key in (("user_name", user, name), ("user", user), ("account", account)):
        e = index.get(key)
        if e is not None and e.confidence >= min_confidence:
            return e
    return None


def policy_at_write(start: Mapping[str, Any] | None, reload: Callable[[], Mapping[str, Any]] | None
                    ) -> Mapping[str, Any] | None:
    """The policy to write into the table: the policy file read again now (``reload``), else
    ``start``, the policy read at the run's start.

    Why: a run takes minutes to hours at a large site. An admin who rolled back meanwhile (mode
    shadow in the policy file, ``policy apply``) had the rollback undone by the run's table
    write, which carried the policy read at its start. A file that no longer loads (an edit half
    done) leaves ``start``, with a warning naming the file's error."""
    if reload is None:
        return start
    try:
        return reload()
    except WattclassError as exc:
        log.warning("the policy file no longer loads (%s); the table gets the policy read at the run's "
                    "start", clip(str(exc)))
        return start
