"""Import a package's submodules without running its ``__init__`` until something needs it.

google-cloud-compute's ``google/cloud/compute_v1/__init__.py`` imports all of its ~100
service clients: 1.1 s of CPU on every cold start of a function that uses two of them
(``python -X importtime``). ``lean("google.cloud.compute_v1")`` registers the package
without running that file, so ``google.cloud.compute_v1.services.instances`` and
``...types.compute`` import alone. Nothing else changes: the first attribute anyone
asks of the package itself (``compute_v1.AcceleratorTypesClient``, ``from
google.cloud.compute_v1 import X``, unless X is a submodule) runs the real ``__init__``
then, into the same module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any


_registering = threading.Lock()  # passes' threads call lean (compute.v1) side by side


def lean(name: str) -> None:
    """Register package ``name`` without running its ``__init__`` (no-op once imported)."""
    with _registering:
        if name not in sys.modules:
            _register(name)


def _register(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not a package")
    package = types.ModuleType(name)
    package.__spec__, package.__path__, package.__file__ = spec, list(spec.submodule_search_locations), spec.origin
    package.__package__, package.__loader__ = name, spec.loader
    lock = threading.RLock()
    state = {"loaded": False}

    def __getattr__(attribute: str) -> Any:  # PEP 562: only for names the package does not hold yet
        if not state["loaded"] and importlib.util.find_spec(f"{name}.{attribute}") is not None:
            return importlib.import_module(f"{name}.{attribute}")  # a submodule: no __init__ needed
        with lock:
            if not state["loaded"]:
                state["loaded"] = True  # first: the __init__'s own imports come back here
                spec.loader.exec_module(package)  # type: ignore[union-attr]
        if attribute in package.__dict__:
            return package.__dict__[attribute]
        raise AttributeError(f"module {name!r} has no attribute {attribute!r}")

    package.__getattr__ = __getattr__  # type: ignore[attr-defined]
    parent, _, child = name.rpartition(".")
    sys.modules[name] = package
    if parent:
        setattr(importlib.import_module(parent), child, package)
