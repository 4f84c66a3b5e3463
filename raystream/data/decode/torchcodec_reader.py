"""torchcodec (the PyTorch project's decoder, on the system's FFmpeg 4-8) behind backends.py's reader interface, on
the CPU or on NVIDIA's hardware decoder (NVDEC).

`VideoDecoder(path, seek_mode="exact")` scans the file once and indexes frame i as the i-th frame in presentation
order (the definition docs/videos.md gives), so `get` is one `get_frames_at` call, whatever the codec or frame
rate. With `size` the decoder scales the frames itself (`torchcodec.transforms.Resize`: bilinear, antialiased),
so nobody resizes them in Python. With `device="cuda"` (a CUDA torch and torchcodec's CUDA build) the frames are
decoded by NVDEC into device memory and scaled there; `get` then returns a uint8 CUDA tensor (n, H, W, 3), which
frames.crop_square crops on the device. `cuda_unavailable()` says why a machine cannot.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from raystream.data.errors import DataError, first_line, span


def torchcodec_unavailable() -> Optional[str]:
    """Why torchcodec cannot decode here (not installed, or a build that does not load beside this torch); None
    when it imports."""
    try:
        import torchcodec.decoders  # noqa: F401  - lazy: this import is the question asked
    except ImportError as exc:
        if getattr(exc, "name", None) == "torchcodec":
            return "torchcodec is not installed (pip install 'raystream[torchcodec]')"
        return f"torchcodec does not load: {first_line(exc)}"
    except (OSError, RuntimeError) as exc:  # a CUDA build beside a CPU torch, or no FFmpeg libraries
        return f"torchcodec does not load: {first_line(exc)}"
    return None


def cuda_unavailable() -> Optional[str]:
    """Why frames cannot be decoded on the GPU here (one line); None when torch sees a CUDA device and torchcodec
    loads (whether this torchcodec build has NVDEC shows when the first decoder opens: TorchCodecReader says so)."""
    import torch  # lazy: the probe child that reads with PyAV or decord never imports torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    why = torchcodec_unavailable()
    if why is None:
        import torchcodec  # lazy: loaded just above, only where it loads

        if str(torchcodec.__version__).endswith("+cpu"):
            return (f"torchcodec {torchcodec.__version__} is a CPU build: install the CUDA build matching torch "
                    f"{torch.__version__} (docs/videos.md)")
    return why


def decode_device(requested: str, decoder: str) -> Tuple[str, Optional[str]]:
    """(the device frames are decoded on, why not `requested` or None): `data.decode_device` = "cuda" decodes on
    the GPU where `data.decoder` is torchcodec or auto and `cuda_unavailable()` is None; elsewhere on the CPU."""
    if requested != "cuda":
        return "cpu", None
    if decoder not in ("torchcodec", "auto"):
        return "cpu", f"data.decode_device=cuda decodes with torchcodec only (data.decoder = {decoder})"
    why = cuda_unavailable()
    if why is not None:
        return "cpu", f"data.decode_device=cuda: decoding on the CPU: {why}"
    return "cuda", None


def scale_frames(frames, size: Tuple[int, int]):
    """uint8 frames (n, H, W, 3) scaled to `size` = (height, width) where they are (bilinear, antialiased, as
    torchcodec's Resize on the CPU): how the GPU path scales what NVDEC decoded without leaving the device."""
    import torch  # lazy: loaded with torchcodec already
    import torch.nn.functional as F  # lazy: as torch

    scaled = F.interpolate(frames.permute(0, 3, 1, 2).float(), size=tuple(size), mode="bilinear", antialias=True,
                           align_corners=False)
    return scaled.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


class TorchCodecReader:
    """torchcodec.decoders.VideoDecoder with seek_mode="exact", one FFmpeg thread, frames as (n, H, W, 3) uint8."""

    def __init__(self, path: str, size: Optional[Tuple[int, int]] = None, device: str = "cpu"):
        from torchcodec.decoders import VideoDecoder  # lazy: a decoder library loads with its first reader
        from torchcodec.transforms import Resize  # lazy: as VideoDecoder

        self.path, self.device = str(path), str(device)
        height_width = (int(size[1]), int(size[0])) if size is not None else None
        # torchcodec 0.11 applies transforms on the CPU only ("Transforms are only supported for CPU devices"):
        # on the GPU the frames are scaled on the device after decoding (bilinear, antialiased, as Resize does)
        self._device_size = height_width if self.device != "cpu" else None
        transforms = [Resize(height_width)] if height_width is not None and self._device_size is None else None
        try:
            self._dec = VideoDecoder(self.path, seek_mode="exact", num_ffmpeg_threads=1, dimension_order="NHWC",
                                     device=self.device, transforms=transforms)
        except (RuntimeError, ValueError, OSError) as exc:
            raise DataError(f"{self.path}: torchcodec cannot open it as a video: {first_line(exc)}") from None
        meta = self._dec.metadata
        self.num_frames = len(self._dec)
        self.fps = float(meta.average_fps or 0.0)
        self.height, self.width = height_width or (int(meta.height), int(meta.width))

    def get(self, indices: Sequence[int]):
        """Frames `indices` (any order) as uint8 (n, H, W, 3): a numpy array, or a CUDA tensor on the GPU."""
        indices = [int(i) for i in indices]
        if not indices:
            return np.zeros((0, self.height, self.width, 3), dtype=np.uint8)
        try:
            data = self._dec.get_frames_at(indices).data
        except (RuntimeError, IndexError, ValueError) as exc:
            raise DataError(f"{self.path}: torchcodec failed to decode frames {span(indices)}: {first_line(exc)}") from None
        if self._device_size is not None and tuple(data.shape[1:3]) != self._device_size:
            data = scale_frames(data, self._device_size)
        return data if data.is_cuda else data.numpy()

    def times_of(self, indices: Sequence[int]) -> List[float]:
        """Seconds of frames `indices` from the first frame, as torchcodec's index has them (decodes them)."""
        try:
            pts = self._dec.get_frames_at([0, *[int(i) for i in indices]]).pts_seconds.tolist()
        except (RuntimeError, IndexError, ValueError) as exc:
            raise DataError(f"{self.path}: torchcodec failed to decode frames {span([int(i) for i in indices])}: "
                            f"{first_line(exc)}") from None
        return [float(p - pts[0]) for p in pts[1:]]

    @property
    def keyframes(self) -> List[int]:
        return sorted({0, *(int(k) for k in self._dec._get_key_frame_indices())})

    @property
    def cpu_fallback(self) -> Optional[str]:
        """On the GPU, why torchcodec decodes on the CPU after all (its CpuFallbackStatus); None where it does not."""
        status = getattr(self._dec, "cpu_fallback", None)  # torchcodec 0.11 and later report it
        return str(status) if status else None

    def close(self) -> None:
        self._dec = None
