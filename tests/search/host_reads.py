"""Counting host reads of tensor data during a search or a translation, on any device.

On a GPU every read of device data by the host (``.item()``, ``bool(t)``, ``.cpu()``,
``torch.equal``, boolean-mask indexing, ``.nonzero()`` ...) waits until the device's queue is
empty; on the CPU the same calls cost nothing, so a slow loop would go unseen. `HostReads`
counts them wherever the tensors live: the aten operations that read values or sizes back
(seen by a dispatch mode), plus the tensor methods that copy data out without one (``.cpu()``,
``.tolist()``), patched for the duration. (``.numpy()`` needs a CPU tensor: it follows a
``.cpu()`` already counted.)

Collectives of `torch.distributed` (``c10d`` operations, which the dispatch mode sees too) are
counted apart, in ``collectives``: under DDP each is a blocking wait for the other ranks, and on
GPUs a host read usually follows it.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class HostReads(TorchDispatchMode):
    """``with HostReads() as reads:`` ... ``reads.total``, ``reads.by_name`` (a Counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: collections.Counter[str] = collections.Counter()
        self.collectives: collections.Counter[str] = collections.Counter()
        self._saved: dict[str, Any] = {}

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet in _READING_OPS:
            self.by_name[packet.__name__] += 1
        elif packet in _INDEXING_OPS and _has_mask(args[1]):
            self.by_name[f"{packet.__name__} (boolean mask)"] += 1
        elif func.namespace == "c10d":
            self.collectives[packet.__name__] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostReads:
        for name in _METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counting(name, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved.clear()

    def _counting(self, name: str, original: Any) -> Any:
        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.by_name[name] += 1
            return original(tensor, *args, **kwargs)

        return method


def _has_mask(indices: Any) -> bool:
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )
