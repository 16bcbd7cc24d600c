"""The sysadmin's power policy (TOML): validated once at load, then plain data.

The policy says what a label means for a job: a power cap (watts or a share of the GPU's
default limit), placement features, who is exempt, how confident a label must be before it is
acted on (``min_confidence``, optionally per label), and whether to act at all (``shadow`` mode
decides and logs but changes nothing). It is read by ``wattclass policy check/explain`` and by the
nightly run, which embeds ``Policy.table_dict()`` into the Lua label table so job_submit.lua never
parses TOML. Caps travel as text ("60%", "350W") in admin_comment; the Prolog turns them into
watts per GPU with ``cap_watts`` because only there is the GPU's default limit known.

Every error names the file and the key, since a sysadmin reads them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from wattclass.admincomment import canary_threshold
from wattclass.caps import Cap, cap_watts, parse_cap
from wattclass.errors import ConfigError
from wattclass.fsutil import read_trusted_bytes
from wattclass.labeltable import LABELS, MODES, slurm_account

_TOP_KEYS = {"mode", "min_confidence", "min_confidence_by_label", "caps", "placement", "exempt", "canary"}
_EXEMPT_KEYS = ("accounts", "partitions", "users")
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Policy:
    """A validated policy. Build with ``load_policy`` or ``parse_policy``."""

    mode: Literal["enforce", "shadow"] = "shadow"
    min_confidence: float = 0.8
    #: ``[min_confidence_by_label]``: a threshold for the labels the sysadmin named; the others use
    #: ``min_confidence``. Why (issue 13): the two errors cost differently. A compute-bound job
    #: called ``memory`` gets capped and slows down; a memory-bound job called ``compute`` only
    #: misses a saving; so a site may ask more evidence before acting on a ``memory`` call.
    min_confidence_by_label: dict[str, float] = field(default_factory=dict)
    caps: dict[str, Cap] = field(default_factory=dict)
    features: dict[str, list[str]] = field(default_factory=dict)
    exempt_accounts: frozenset[str] = frozenset()
    exempt_partitions: frozenset[str] = frozenset()
    exempt_users: frozenset[str] = frozenset()
    #: Share of eligible jobs in the canary arm (``[canary] fraction``): capped in shadow mode,
    #: left uncapped as the control in enforce mode; 0 means no canary.
    canary_fraction: float = 0.0
    source: str = "<policy>"

    def threshold(self, label: str) -> float:
        """The confidence a key labelled ``label`` needs before the policy acts on it."""
        return self.min_confidence_by_label.get(label, self.min_confidence)

    def feature_names(self) -> set[str]:
        """Every node feature a ``[placement.<label>]`` names (offered only where a node has it)."""
        return {f for fs in self.features.values() for f in fs}

    def effective_thresholds(self) -> dict[str, float]:
        """Every label's threshold (``policy check`` and ``policy explain`` print them)."""
        return {label: self.threshold(label) for label in LABELS}

    def table_dict(self, available_features: Iterable[str] | None = None) -> dict[str, Any]:
        """Plain data for the label table's ``policy`` key (read by job_submit.lua).

        ``available_features``: the features that exist on some node (from sinfo). Only those are
        offered to Lua, since adding an unknown feature makes sbatch fail. None keeps them all.
        """
        avail = None if available_features is None else set(available_features)
        decisions: dict[str, Any] = {}
        for label in LABELS:
            if label not in self.caps and label not in self.features:
                continue
            feats = [f for f in self.features.get(label, []) if avail is None or f in avail]
            cap = self.caps.get(label)
            decisions[label] = {"cap": cap.text() if cap else None, "features": feats}
        all_feats = sorted(self.feature_names())
        return {
            "mode": self.mode,
            "min_confidence": self.min_confidence,
            "min_confidence_by_label": {lb: self.min_confidence_by_label[lb] for lb in LABELS
                                        if lb in self.min_confidence_by_label},
            "decisions": decisions,
            "features_available": {f: True for f in all_feats if avail is None or f in avail},
            "canary_threshold": canary_threshold(self.canary_fraction),
            "exempt": {
                "accounts": {a: True for a in sorted(self.exempt_accounts)},
                "partitions": {p: True for p in sorted(self.exempt_partitions)},
                "users": {u: True for u in sorted(self.exempt_users)},
            },
        }


def _str_list(value: object, where: str) -> list[str]:
    """Names (users, accounts, partitions, node features): no Slurm name has white space around
    it, so " alice" is a typo that would never match (an exemption that silently exempts nobody).
    Nor a comma, Slurm's list separator: ``partitions = ["debug,test"]`` is one name that matches no
    partition (job_submit.lua compares each partition of a job's ``-p a,b`` list), not two."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of non-empty strings, got {value!r}")
    for v in value:
        if v != v.strip():
            raise ConfigError(f"{where}: {v!r} has white space around it; no Slurm name has")
        if "," in v:
            parts = ", ".join(f'"{x.strip()}"' for x in v.split(","))
            raise ConfigError(f"{where}: {v!r} holds a comma, which no Slurm name has; one name per "
                              f"string: [{parts}]")
    return list(value)


def _parse_canary(sect: object, source: str) -> float:
    """``[canary] fraction``: a share in [0, 0.5] (a canary larger than half is not a canary)."""
    if not isinstance(sect, dict):
        raise ConfigError(f"{source}: canary: expected a table with key fraction")
    extra = sorted(set(sect) - {"fraction"})
    if extra:
        raise ConfigError(f"{source}: canary: unknown key {extra[0]!r} (known: fraction)")
    frac = sect.get("fraction", 0.0)
    if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0.0 <= float(frac) <= 0.5:
        raise ConfigError(f"{source}: canary.fraction: expected a number in [0, 0.5], got {frac!r}")
    return float(frac)


def _confidence(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{where}: expected a number in [0, 1], got {value!r}")
    return float(value)


def _parse_by_label(sect: object, source: str) -> dict[str, float]:
    """``[min_confidence_by_label]``: label -> threshold in [0, 1].

    A threshold below ``min_confidence`` is allowed: a label whose decision costs little when
    wrong (``compute`` at "100%", say) may be trusted sooner, and a trusted ``compute`` key also
    stops the fall-through to a broader key that might say ``memory``. ``policy check`` prints
    every label's effective threshold, so a typo in the number is visible.
    """
    if not isinstance(sect, dict):
        raise ConfigError(f"{source}: min_confidence_by_label: expected a table of label = number, "
                          f"got {sect!r}")
    out: dict[str, float] = {}
    for label, value in sect.items():
        where = f"{source}: min_confidence_by_label.{label}"
        if label not in LABELS:
            raise ConfigError(f"{where}: unknown label (known: {', '.join(LABELS)})")
        out[label] = _confidence(value, where)
    return out


def parse_policy(doc: Mapping[str, Any], source: str = "<policy>") -> Policy:
    """Validate a parsed TOML document; errors read ``<source>: <key>: <problem>``."""
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    mode = doc.get("mode", "shadow")
    if mode not in MODES:
        raise ConfigError(f"{source}: mode: expected \"enforce\" or \"shadow\", got {mode!r}")
    mc = _confidence(doc.get("min_confidence", 0.8), f"{source}: min_confidence")
    by_label = _parse_by_label(doc.get("min_confidence_by_label", {}), source)

    caps_doc = doc.get("caps", {})
    if not isinstance(caps_doc, dict):
        raise ConfigError(f"{source}: caps: expected a table")
    caps: dict[str, Cap] = {}
    for label, value in caps_doc.items():
        if label not in LABELS:
            raise ConfigError(f"{source}: caps.{label}: unknown label (known: {', '.join(LABELS)})")
        caps[label] = parse_cap(value, f"{source}: caps.{label}")

    placement = doc.get("placement", {})
    if not isinstance(placement, dict):
        raise ConfigError(f"{source}: placement: expected a table of [placement.<label>]")
    features: dict[str, list[str]] = {}
    for label, sect in placement.items():
        where = f"{source}: placement.{label}"
        if label not in LABELS:
            raise ConfigError(f"{where}: unknown label (known: {', '.join(LABELS)})")
        if not isinstance(sect, dict):
            raise ConfigError(f"{where}: expected a table with key features")
        extra = sorted(set(sect) - {"features"})
        if extra:
            raise ConfigError(f"{where}: unknown key {extra[0]!r} (known: features)")
        feats = _str_list(sect.get("features", []), f"{where}.features")
        for f in feats:
            if not _FEATURE_RE.match(f):
                raise ConfigError(f"{where}.features: {f!r} is not a Slurm feature name")
        features[label] = feats

    exempt = doc.get("exempt", {})
    if not isinstance(exempt, dict):
        raise ConfigError(f"{source}: exempt: expected a table")
    extra = sorted(set(exempt) - set(_EXEMPT_KEYS))
    if extra:
        raise ConfigError(f"{source}: exempt: unknown key {extra[0]!r} (known: {', '.join(_EXEMPT_KEYS)})")
    lists = {k: frozenset(_str_list(exempt.get(k, []), f"{source}: exempt.{k}")) for k in _EXEMPT_KEYS}
    canary = _parse_canary(doc.get("canary", {}), source)
    return Policy(
        mode=mode,
        min_confidence=mc,
        min_confidence_by_label=by_label,
        caps=caps,
        features=features,
        # Slurm keeps accounts lower-case (and job_submit.lua looks them up so): "Physics" is physics
        exempt_accounts=frozenset(slurm_account(a) for a in lists["accounts"]),
        exempt_partitions=lists["partitions"],
        exempt_users=lists["users"],
        canary_fraction=canary,
        source=source,
    )


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file.

    The policy decides who is capped and who is exempt, and the nightly run (root) copies it into
    the table slurmctld trusts, so it is read only if root (or the user running the command) owns
    it and its folder, nobody else can write them, and it is not a symlink (``read_trusted_bytes``).
    """
    path = Path(path)
    try:
        raw = read_trusted_bytes(path, max_bytes=1024 * 1024)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: policy file not found") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read policy file: {exc.strerror}") from exc
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_policy(doc, str(path))


__all__ = ["LABELS", "MODES", "Cap", "Policy", "cap_watts", "load_policy", "parse_cap", "parse_policy"]
