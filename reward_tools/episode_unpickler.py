"""Episode pickles read without running their code.

A pickle is a program: unpickling calls whatever functions it names (`os.system` among them),
so `pickle.load` on a file from a shared or downloaded directory runs that file's code.
`load` here is an unpickler that resolves only the names RLinf's episode files need and refuses
every other name before anything is called:

- numpy arrays, dtypes and scalars (`np.save` of a dict, the arrays in RLinf main's pickles);
- torch CPU tensors as plain `pickle.dump` writes them (`torch._utils._rebuild_tensor_v2` over
  `torch.storage._load_from_bytes`, whose bytes are loaded here with torch's own
  `weights_only=True` loader, not with the `weights_only=False` torch itself uses there);
- plain containers and scalars (dict, list, tuple, set, str, bytes, numbers, bool, None, and
  `collections.OrderedDict`, which a tensor's pickle names).

That is what RLinf main's `CollectEpisode` writes (observations of tensors or arrays, infos of
tensors, numpy bools and nested dicts) and what its earlier `RewardDataCollector` saved in
`.npy` files. torch is imported only when a pickle names a tensor. A refused name raises
`PickleRefused` naming it; nothing of the file has run by then.
"""

from __future__ import annotations

import _compat_pickle
import importlib
import io
import pickle
from collections import OrderedDict
from typing import IO, Any

REFUSED_ADVICE = (
    "a pickle can run any code it names; this one was not run. If you wrote these files yourself "
    "and trust them, pass --trust-pickles"
)


class PickleRefused(pickle.UnpicklingError):
    """A pickle names something outside the allowed set (the message names it)."""


def _numpy(name: str) -> Any:
    """numpy's pickling helpers by either module spelling (numpy 2 `_core`, numpy 1 `core`)."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray", "numpy._core.numeric", "numpy.core.numeric"):
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    raise PickleRefused(f"numpy has no {name}")


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    """numpy's `_reconstruct` for plain ndarrays only: an empty array its BUILD then fills."""
    import numpy as np

    if subtype is not np.ndarray or shape != (0,):
        raise PickleRefused(f"numpy _reconstruct of {subtype!r} with shape {shape!r}: only an ndarray's own pickle")
    return _numpy("_reconstruct")(subtype, shape, dtype)


def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    """Protocol 2's spelling of bytes (`_codecs.encode(str, 'latin1')`), nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise PickleRefused(f"_codecs.encode with {encoding!r}: only protocol 2's latin1 bytes")
    return text.encode("latin1")


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PROTOCOL = 1001


# the legacy storage classes by name, as dtype names (the classes themselves are deprecated);
# any other storage goes to torch's weights-only loader
_STORAGE_DTYPES = {
    "ByteStorage": "uint8",
    "CharStorage": "int8",
    "ShortStorage": "int16",
    "IntStorage": "int32",
    "LongStorage": "int64",
    "HalfStorage": "float16",
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "BFloat16Storage": "bfloat16",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "UntypedStorage": "uint8",
}


class _StorageType:
    """A `torch.<Dtype>Storage` name in a storage's bytes: only its dtype is used, never the class."""

    def __init__(self, name: str):
        self.name = name


class _StorageUnpickler(pickle.Unpickler):
    """The pickles inside one storage's bytes (torch's legacy save of one storage): plain values,
    the storage classes as dtype tags, and the storage itself as a persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        raise PickleRefused(f"a torch storage in it names {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return ("persistent", pid)


def _legacy_storage(data: bytes) -> Any | None:
    """One storage from torch's legacy format as `Storage.__reduce__` writes it (magic, protocol,
    system info, the storage as a persistent id, its key list, then its size and raw bytes), read
    with nothing callable; None when the bytes are laid out any other way (torch's own
    weights-only loader then reads them). torch's weights-only unpickler is pure Python: some
    0.3 ms a storage, 30 ms for an episode of 50 frames and 50 flag tensors; this is ~20 us."""
    import torch

    f = io.BytesIO(data)
    try:
        magic, protocol, info = (_StorageUnpickler(f).load() for _ in range(3))
        kind, saved = _StorageUnpickler(f).load()
        keys = _StorageUnpickler(f).load()
    except PickleRefused:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError):
        return None
    if (magic, protocol, kind) != (LEGACY_MAGIC, LEGACY_PROTOCOL, "persistent") or not isinstance(info, dict):
        return None
    if not info.get("little_endian") or not isinstance(saved, tuple) or len(saved) != 6:
        return None
    what, storage_type, key, _location, numel, view = saved
    dtype = _STORAGE_DTYPES.get(storage_type.name) if isinstance(storage_type, _StorageType) else None
    dtype = getattr(torch, dtype) if dtype else None
    if what != "storage" or dtype is None or view is not None or keys != [key]:
        return None
    size = int.from_bytes(f.read(8), "little")
    nbytes = size * torch.empty((), dtype=dtype).element_size()
    if not isinstance(numel, int) or size != numel or len(data) - f.tell() != nbytes:
        return None
    # a bytearray: the storage owns writable memory, as one torch.load makes
    start = f.tell()
    raw = torch.frombuffer(bytearray(data[start:]), dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
    return torch.TypedStorage(wrap_storage=raw.untyped_storage(), dtype=dtype, _internal=True)


def _torch_storage(data: Any) -> Any:
    """A tensor's storage from its bytes: torch's legacy layout read here (_legacy_storage), any
    other by torch's weights-only loader (torch's own `_load_from_bytes` uses weights_only=False:
    those bytes are one more pickle)."""
    import torch

    if not isinstance(data, bytes):
        raise PickleRefused(f"torch.storage._load_from_bytes of a {type(data).__name__}, not bytes")
    if (storage := _legacy_storage(data)) is not None:
        return storage
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = next((line for line in lines if "GLOBAL" in line), lines[0] if lines else type(exc).__name__)
        raise PickleRefused(f"a torch storage in it was refused by torch's weights-only loader: {said}") from None


def _torch_tensor(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    """torch's `_rebuild_tensor_v2` for a plain tensor: no backward hooks (callables), no metadata."""
    import torch

    if backward_hooks or metadata or not isinstance(storage, torch.TypedStorage):
        raise PickleRefused("a tensor with backward hooks, metadata or a storage of another kind")
    from torch._utils import _rebuild_tensor_v2

    return _rebuild_tensor_v2(storage, storage_offset, size, stride, bool(requires_grad), OrderedDict())


_BUILTINS = {"set": set, "frozenset": frozenset, "complex": complex, "bytearray": bytearray}
_ALLOWED: dict[tuple[str, str], Any] = {
    **{("builtins", name): value for name, value in _BUILTINS.items()},
    ("collections", "OrderedDict"): OrderedDict,
    ("_codecs", "encode"): _codecs_encode,
    ("torch._utils", "_rebuild_tensor_v2"): _torch_tensor,
    ("torch.storage", "_load_from_bytes"): _torch_storage,
}
_NUMPY_MODULES = (
    "numpy",
    "numpy._core.multiarray",
    "numpy.core.multiarray",
    "numpy._core.numeric",
    "numpy.core.numeric",
)


def _resolve_numpy(module: str, name: str) -> Any | None:
    import numpy as np

    if module == "numpy" and name in ("ndarray", "dtype"):
        return getattr(np, name)
    if module in _NUMPY_MODULES[1:3] and name == "_reconstruct":
        return _reconstruct
    if module in _NUMPY_MODULES[1:3] and name == "scalar":
        return _numpy("scalar")
    if module in _NUMPY_MODULES[3:] and name == "_frombuffer":  # protocol 5's arrays
        return _numpy("_frombuffer")
    return None


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the allowed names (module docstring); every other one is
    a PickleRefused before it is looked up, let alone called."""

    def find_class(self, module: str, name: str) -> Any:
        # Python 2's names (protocols 0-2 write `__builtin__.set`), mapped as pickle's own find_class
        # does; the result is checked like any other name
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module in _NUMPY_MODULES and (found := _resolve_numpy(module, name)) is not None:
            return found
        raise PickleRefused(
            f"it names {module}.{name}, which is not a numpy array, dtype or scalar, a torch tensor, "
            "a plain container or a scalar"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise PickleRefused("it refers to persistent objects outside the file")


def load(file: IO[bytes]) -> Any:
    """One object unpickled from `file` with only the allowed names (PickleRefused otherwise)."""
    return RestrictedUnpickler(file).load()


__all__ = ["REFUSED_ADVICE", "PickleRefused", "RestrictedUnpickler", "load"]
