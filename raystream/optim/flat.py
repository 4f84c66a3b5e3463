"""Flat buffers: tensors of one device laid end to end, so that a sum over every tensor is one reduction and an
update of every tensor one op, whatever their number.

`Flat(tensors, rows, dtype)` holds `data`, of shape (rows, N) with N the tensors' total size (each row contiguous),
and for each row a view shaped like each tensor (`views[r][i]`): `torch._foreach_copy_(flat.views[r], grads)` fills
a row in one op. `Workspace` keeps such buffers from one step to the next as scratch space.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


class Flat:
    def __init__(self, tensors: Sequence[Tensor], rows: int, dtype: torch.dtype):
        sizes = [t.numel() for t in tensors]
        device = tensors[0].device
        n = sum(sizes)
        # rows start 256-byte aligned: a dot product of the same data gives the same bits in either row (SIMD
        # reductions round by alignment), so a restored previous gradient reproduces an uninterrupted run
        self.data = torch.zeros(rows, -(-n // 64) * 64, dtype=dtype, device=device)[:, :n]
        self.views: List[List[Tensor]] = [list(row.split(sizes)) for row in self.data]
        for row in self.views:
            for i, t in enumerate(tensors):
                row[i] = row[i].view(t.shape)
        self.lengths = torch.tensor(sizes, dtype=torch.long, device=device)


def buckets(tensors: Sequence[Tensor], dtype_of: Callable[[Tensor], torch.dtype]) -> Dict[Tuple, List[int]]:
    """Indices of `tensors` by (device, dtype_of(tensor)), in order: the tensors one flat buffer can hold."""
    out: Dict[Tuple, List[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault((t.device, dtype_of(t)), []).append(i)
    return out


class Workspace:
    """Scratch flat buffers for one step, kept for the next step while the tensors' layout (shapes, dtypes, devices)
    is the same, so a steady run allocates nothing. A step copies into them and reads out of them; nothing else points
    into them (an optimizer's state never does), so a changed layout only means new buffers."""

    def __init__(self, rows: int):
        self.rows = rows
        self._layout: Optional[tuple] = None
        self._buffers: List[Tuple[List[int], Flat]] = []

    def buffers(self, tensors: Sequence[Tensor], dtype_of: Callable[[Tensor], torch.dtype]) -> List[Tuple[List[int],
                                                                                                       Flat]]:
        """(indices into `tensors`, Flat of `rows` rows) per (device, dtype_of) bucket of `tensors`."""
        layout = tuple((t.shape, t.dtype, t.device) for t in tensors)
        if layout != self._layout:
            self._layout = layout
            self._buffers = [(idx, Flat([tensors[i] for i in idx], rows=self.rows, dtype=dtype))
                             for (_, dtype), idx in buckets(tensors, dtype_of).items()]
        return self._buffers
