"""Read the tensors of a foreign torch checkpoint without running any code pickled into it.

A Lightning checkpoint written by another project (the MDLM reference among them) keeps objects of its
own classes next to the weights: `hyper_parameters` holds an OmegaConf config and, in the MDLM reference,
the tokenizer object. torch's safe loader (`weights_only=True`) refuses such a file, and the unsafe one
imports and runs whatever classes the file names. This loader takes a third way:

- every global on torch's own weights-only allow-list (tensor rebuilds, dtypes, OrderedDict, ...) is the
  real object, so tensors, dicts and lists load exactly as `torch.load` would load them;
- every other global becomes an inert placeholder (`Opaque`) that remembers its name and the arguments and
  state the pickle gave it; no module is imported and no method of the original class runs.

So `state_dict`, `ema` and the other plain containers come back as usual, and `hyper_parameters["config"]`
comes back as an `Opaque` named `omegaconf.dictconfig.DictConfig`.
"""

from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any

import torch


class Opaque:
    """Stands for an object of a class that was not imported; its code never ran."""

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(cls)
        obj.args, obj.state = args, None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<not loaded: {self.qualname}>"


def _allowed_globals() -> dict[str, Any]:
    """torch's weights-only allow-list ("module.name" -> object); a minimal list if this torch lacks it."""
    from torch import _weights_only_unpickler as safe

    getter = getattr(safe, "_get_allowed_globals", None)
    if getter is not None:
        return dict(getter())
    import collections

    import torch._utils as tu

    names = {"collections.OrderedDict": collections.OrderedDict,
             "torch._utils._rebuild_tensor_v2": tu._rebuild_tensor_v2,
             "torch._utils._rebuild_parameter": tu._rebuild_parameter,
             "torch.Size": torch.Size}
    return names


class _Unpickler(pickle.Unpickler):
    _allowed = None

    def find_class(self, module: str, name: str) -> Any:
        allowed = type(self)._allowed
        if allowed is None:
            allowed = type(self)._allowed = _allowed_globals()
        qualname = f"{module}.{name}"
        if qualname in allowed:
            return allowed[qualname]
        return type(name, (Opaque,), {"qualname": qualname})


# torch.load wants a module with an Unpickler class (it subclasses it to read storages) and load().
_PICKLE_MODULE = types.ModuleType("seqdiff_tensors_only_pickle")
_PICKLE_MODULE.Unpickler = _Unpickler
_PICKLE_MODULE.load = lambda file, **kwargs: _Unpickler(file, **kwargs).load()
_PICKLE_MODULE.__dict__.update({k: getattr(pickle, k) for k in ("UnpicklingError", "HIGHEST_PROTOCOL")})


def load_tensors_only(path: str | Path) -> Any:
    """`torch.load(path)` on the CPU with every non-allow-listed class replaced by an `Opaque` placeholder."""
    return torch.load(Path(path), map_location="cpu", pickle_module=_PICKLE_MODULE, weights_only=False)


__all__ = ["Opaque", "load_tensors_only"]
