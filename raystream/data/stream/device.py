"""Batches on the training device: uint8 over the bus, copied a step ahead, made float there.

    stream = DeviceStream(build_stream(data_cfg, stream_cfg, rank, world_size), device)   # a drop-in for the stream
    for batch in stream: model(batch.model_inputs(device))    # frames on `device` already; clip places on the host
    stream.state_dict() / load_state_dict(d) / close()        # follow the batches yielded, not the ones copied ahead

The stream hands over uint8 frames (4x fewer bytes than float32), on CUDA assembled straight into pinned host memory;
the copy of the next `prefetch` batches is issued on a side CUDA stream while the current step runs, and the frames
are converted to `stream.dtype` (float in [0, 1]) on the device. The training stream waits for that side stream
before it uses a batch. On a CPU device there is no pinning and no side stream: batches are converted in place
of the copy, so the same code runs (and is tested) without a GPU.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Iterator, Optional, Tuple

import torch

from raystream.data.stream.batches import Batch, ClipStream


class DeviceStream:
    """Iterates `stream`'s batches with their tensors on `device`, `prefetch` batches copied ahead."""

    def __init__(self, stream: ClipStream, device, prefetch: int = 1):
        self.stream = stream
        self.device = torch.device(device)
        self.prefetch = max(1, int(prefetch))
        self.cuda = self.device.type == "cuda"
        self._step = stream.state_dict()["step"]

    @property
    def num_steps(self) -> int:
        return self.stream.num_steps

    def state_dict(self) -> dict:
        """The stream's state at the next batch this iterator yields (batches copied ahead do not count)."""
        return {**self.stream.state_dict(), "step": self._step}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)
        self._step = int(state["step"])

    def close(self) -> None:
        self.stream.close()

    def __iter__(self) -> Iterator[Batch]:
        host = self.stream.batches(self._step, uint8=True, pin_memory=self.cuda)
        side = torch.cuda.Stream(self.device) if self.cuda else None
        ahead: Deque[Tuple[Batch, Optional[torch.cuda.Event]]] = deque()
        try:
            for batch in host:
                ahead.append(self._to_device(batch, side))
                if len(ahead) > self.prefetch:
                    yield self._ready(*ahead.popleft())
            while ahead:
                yield self._ready(*ahead.popleft())
        finally:
            host.close()

    def _to_device(self, batch: Batch, side) -> Tuple[Batch, Optional["torch.cuda.Event"]]:
        as_float = self.stream.dtype != "uint8"

        def move(t: Optional[torch.Tensor], frames: bool = False) -> Optional[torch.Tensor]:
            if t is None:
                return None
            t = t.to(self.device, non_blocking=True)
            return t.float().div_(255.0) if frames and as_float else t

        if side is None:
            return _replace(batch, move), None
        with torch.cuda.stream(side):
            moved = _replace(batch, move)
            event = torch.cuda.Event()
            event.record(side)
        return moved, event

    def _ready(self, batch: Batch, event) -> Batch:
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in (batch.frames, batch.target):
                if t is not None:
                    t.record_stream(current)  # made on the side stream: keep its memory until this stream is done
        self._step = batch.step + 1
        return batch


def _replace(batch: Batch, move) -> Batch:
    return Batch(step=batch.step, frames=move(batch.frames, True), target=move(batch.target, True),
                 index=batch.index, video_index=batch.video_index, clips=batch.clips)  # read on the host
