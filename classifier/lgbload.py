"""Import LightGBM without scikit-learn where only its core API is used.

Why (issue 15): ``import lightgbm`` imports scikit-learn first (lightgbm/compat.py tries it, for
the sklearn-style estimators), and scikit-learn imports SciPy's statistics: about 1 s of CPU, a
quarter of a whole nightly at 1,000 GPUs, for a module wattclass never calls. wattclass uses
LightGBM's core API (``Dataset``, ``train``, ``Booster``), which does not need it. So ``core()``
imports LightGBM with ``sklearn`` marked absent in ``sys.modules`` (Python then raises
ImportError for it, which lightgbm/compat.py catches as "not installed"), and restores the entry
afterwards. Only ``DaskLGBMClassifier`` (dasktrain.train_model_dask) needs the sklearn-style API:
``full()`` gives a LightGBM with it, re-importing LightGBM's Python modules if they were loaded
the light way (the compiled library is loaded once per process either way).

If scikit-learn is already imported, or LightGBM is, the plain import is used: nothing is
blocked then. If a LightGBM version ever required scikit-learn, the light import fails and the
plain one runs. While ``core()`` imports, an ``import sklearn`` in another thread fails (the
entry is process-wide); wattclass imports scikit-learn nowhere but through ``full()``, which
takes the same lock.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType

_LOCK = threading.Lock()
_BLOCKED = "sklearn"


def core() -> ModuleType:
    """LightGBM, imported without scikit-learn unless either is already loaded.

    Thread-safe: folds trained side by side call this at once; a caller never gets the module
    while another thread is still importing it."""
    with _LOCK:
        mod = sys.modules.get("lightgbm")
        if mod is not None or _BLOCKED in sys.modules:
            return importlib.import_module("lightgbm")
        sys.modules[_BLOCKED] = None  # type: ignore[assignment]  # documented: import raises
        try:
            return importlib.import_module("lightgbm")
        except ImportError:
            _forget_lightgbm()
        finally:
            if sys.modules.get(_BLOCKED, 0) is None:
                del sys.modules[_BLOCKED]
        return importlib.import_module("lightgbm")


def full() -> ModuleType:
    """LightGBM with its scikit-learn API (for ``DaskLGBMClassifier``)."""
    with _LOCK:
        mod = sys.modules.get("lightgbm")
        if mod is not None and not _has_sklearn_api(mod):
            _forget_lightgbm()
        return importlib.import_module("lightgbm")


def _has_sklearn_api(mod: ModuleType) -> bool:
    compat = getattr(mod, "compat", None)
    return bool(getattr(compat, "SKLEARN_INSTALLED", False))


def _forget_lightgbm() -> None:
    for name in [n for n in sys.modules if n == "lightgbm" or n.startswith("lightgbm.")]:
        del sys.modules[name]
