"""Counting host reads of tensor data during a search or a translation, on any device.

On a GPU every read of device data by the host (``.item()``, ``bool(t)``, ``.cpu()``,
``torch.equal``, boolean-mask indexing, ``.nonzero()`` ...) waits until the device's queue is
empty; on the CPU the same calls cost nothing, so a slow loop would go unseen. `HostReads`
counts them wherever the tensors live: the aten operations that read values or sizes back
(seen by a dispatch mode), plus the tensor methods that copy data out without one (``.cpu()``,
``.tolist()``), patched for the duration. (``.numpy()`` needs a CPU tensor: it follows a
``.cpu()`` already counted.) Python numbers made into tensors on a named device
(``torch.tensor(x, device=d)``, a host-to-device copy on a GPU) are counted apart, in ``copies``;
with ``sites=True``, ``sites`` counts every one of them by the convseq, Lightning or test line
that asked.

Collectives of `torch.distributed` (``c10d`` operations, which the dispatch mode sees too) are
counted apart, in ``collectives``: under DDP each is a blocking wait for the other ranks, and on
GPUs a host read usually follows it.
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten

# operations whose result depends on device values the host must see
_READING_OPS = {
    aten._local_scalar_dense,
    aten.item,
    aten.is_nonzero,
    aten.equal,
    aten.nonzero,
    aten.masked_select,
    aten._unique2,
    aten.unique_consecutive,
}
_INDEXING_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_METHODS = ("cpu", "tolist")
_MAKERS = ("tensor", "as_tensor")


class HostReads(TorchDispatchMode):
    """``with HostReads() as reads:`` ... ``reads.total``, ``reads.by_name`` (a Counter)."""

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.by_name: collections.Counter[str] = collections.Counter()
        self.collectives: collections.Counter[str] = collections.Counter()
        # with sites=True: "name at file:line (function)" of the innermost convseq or
        # Lightning frame that asked for each read or collective
        self.sites: collections.Counter[str] | None = collections.Counter() if sites else None
        # Python numbers made into tensors on a named device (``torch.tensor(0.5, device=d)``):
        # on a GPU each is a host-to-device copy the host waits for
        self.copies: collections.Counter[str] = collections.Counter()
        self._saved: dict[str, Any] = {}

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet in _READING_OPS:
            self._count(self.by_name, packet.__name__)
        elif packet in _INDEXING_OPS and _has_mask(args[1]):
            self._count(self.by_name, f"{packet.__name__} (boolean mask)")
        elif func.namespace == "c10d":
            self._count(self.collectives, packet.__name__)
        return func(*args, **(kwargs or {}))

    def _count(self, counter: collections.Counter, name: str) -> None:
        counter[name] += 1
        if self.sites is not None:
            self.sites[f"{name} at {_caller()}"] += 1

    def __enter__(self) -> HostReads:
        for name in _METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counting(name, original))
        for name in _MAKERS:
            original = getattr(torch, name)
            self._saved[f"torch.{name}"] = original
            setattr(torch, name, self._copying(name, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                if name.startswith("torch."):
                    setattr(torch, name[len("torch.") :], original)
                else:
                    setattr(torch.Tensor, name, original)
            self._saved.clear()

    def _copying(self, name: str, original: Any) -> Any:
        def make(data: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(data, (bool, int, float)) and kwargs.get("device") is not None:
                self._count(self.copies, f"torch.{name}(number, device=...)")
            return original(data, *args, **kwargs)

        return make

    def _counting(self, name: str, original: Any) -> Any:
        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self._count(self.by_name, name)
            return original(tensor, *args, **kwargs)

        return method


class DeviceReads(HostReads):
    """`HostReads` that tells host memory from the training device's when both are the CPU.

    On a CPU-only machine every tensor is a host tensor, so reading one back costs nothing and
    tells nothing about a GPU. Here a tensor counts as host memory when it was made so as it
    would be on a GPU: ``.cpu()`` of anything (which makes a copy here as well), a tensor made
    from Python data without a ``device`` (``torch.tensor(x)``), and anything computed from host
    tensors alone. Reads of those (``.item()`` of a value already copied to the host, a flag
    agreed over a gloo group) are not counted; every other read is one the host would wait for
    on a GPU. The ``.cpu()`` copy itself counts as a read, as in `HostReads`; a collective of
    host tensors counts in ``collectives`` as "<name> (host)".
    """

    def __init__(self, sites: bool = False) -> None:
        super().__init__(sites=sites)
        self._host: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def _on_host(self, tensors: list[torch.Tensor]) -> bool:
        return bool(tensors) and all(t in self._host for t in tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [a for a in _flat(args, kwargs) if isinstance(a, torch.Tensor)]
        if self._on_host(inputs):  # a host computation: no read to count, a host result
            if func.namespace == "c10d":  # still a wait for the other ranks
                self._count(self.collectives, f"{func.overloadpacket.__name__} (host)")
            out = func(*args, **(kwargs or {}))
            for t in _flat(out):
                if isinstance(t, torch.Tensor):
                    self._host[t] = True
            return out
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _counting(self, name: str, original: Any) -> Any:
        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor in self._host:
                return original(tensor, *args, **kwargs)
            self._count(self.by_name, name)
            out = original(tensor, *args, **kwargs)
            if name == "cpu":
                out = out.clone() if out is tensor else out  # a copy, as from a GPU
                self._host[out] = True
            return out

        return method

    def _copying(self, name: str, original: Any) -> Any:
        counted = super()._copying(name, original)

        def make(data: Any, *args: Any, **kwargs: Any) -> Any:
            out = counted(data, *args, **kwargs)
            if kwargs.get("device") is None and not isinstance(data, torch.Tensor):
                self._host[out] = True  # Python data without a device: host memory
            return out

        return make


def _flat(*trees: Any) -> list[Any]:
    """The leaves of nested lists, tuples and dicts."""
    out: list[Any] = []
    stack = list(trees)
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        else:
            out.append(x)
    return out


def _has_mask(indices: Any) -> bool:
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )


_OWNERS = ("/convseq/", "/pytorch_lightning/", "/lightning_fabric/", "/lightning/", "/tests/")


def _caller() -> str:
    """The innermost frame of convseq's, Lightning's or a test's code on the stack, as
    file:line (function)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path != __file__ and any(owner in path for owner in _OWNERS):
            short = path.split("/site-packages/")[-1].split("/src/")[-1]
            short = "tests/" + short.split("/tests/")[-1] if "/tests/" in short else short
            return f"{short}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "elsewhere"
