"""Structured config of the `trainer` group (`sweeps/trainer/*.yaml`). Plain data: importing it starts no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from raystream.checks import PATH_NAME, Check, is_path_name, one_of


@dataclass
class TrainerConfig:
    """How one run executes on Ray Train: workers, steps, checkpoints, fault tolerance, logging.

    Steps count global batches: step t is the t-th global batch of the stream (0-based), whatever `num_workers`.
    """

    num_workers: int = 1
    use_gpu: bool = False  # one GPU per worker
    cpus_per_worker: float = 1.0  # also the torch thread count of each worker
    max_steps: Optional[int] = None  # None = one pass over the stream x stream.epochs; else at most this many steps
    log_every: int = 10  # steps between progress lines and MLflow flushes (every step is logged, exactly once)
    report_every: int = 10  # steps between ray.train.report calls (what Tune sees); checkpoints also report
    checkpoint_every: int = 50  # steps between checkpoints; the last step is always checkpointed
    keep_checkpoints: int = 2  # CheckpointConfig(num_to_keep)
    max_failures: int = 2  # FailureConfig(max_failures); -1 = retry forever
    storage_path: Optional[str] = None  # local dir or s3:// / gs://; None = ./raystream_results
    run_name: Optional[str] = None  # same name (and storage_path) again = resume from its last checkpoint
    # bf16 autocast of the forward pass: null = on GPU only (the default: on most CPUs bf16 is slower than fp32),
    # true = on any device (CPU too), false = never. The optimizer's state stays fp32 either way.
    bf16: Optional[bool] = None
    # torch.compile of the model's forward and backward, regionally (raystream/models/vit.py `compile_blocks`: every
    # ViT block compiled in place, one graph for all blocks of a shape, so compiling takes seconds): true, false, or auto
    # (on CUDA only; a CPU stays eager: compiling there costs about a minute and was not measured faster). Default
    # false until the GPU campaign has measured compiled against eager per preset (docs/benchmarks.md).
    compile: Any = False
    find_unused_parameters: bool = False  # DDP flag, for scenarios whose forward skips some parameters
    # the final checkpoint (and each kept one an evaluation was made at) as MLflow LoggedModels of the run: null = for
    # a single run (`raystream train`) and not for a sweep's trials; true / false = for every run / none
    log_checkpoint_artifact: Optional[bool] = None
    ray_log_level: str = "WARNING"  # Ray Train's own log level (INFO shows every report and checkpoint)
    seed: int = 0
    correlation_steps: int = 4  # pairs of consecutive batches measured at run start (raystream/train/correlation.py,
    # MLflow correlation/*) by the workers, on their device; 0 = off
    # clips per forward pass of that measurement on each worker; null = the worker's training batch
    # (stream.batch_size // num_workers). Lower it if the fp32 measurement does not fit where bf16 training does.
    correlation_micro_batch: Optional[int] = None
    # torch.distributed's time-out of a collective (Ray's TorchConfig(timeout_s)): how long a rank waits in an
    # all-reduce for the others before the run fails. Evaluations run on every rank, so none waits that long.
    collective_timeout_s: int = 1800


RAY_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

CHECKS = [
    Check("num_workers", lambda v: v >= 1, "an integer >= 1"),
    Check("checkpoint_every", lambda v: v >= 1, "an integer >= 1"),
    Check("keep_checkpoints", lambda v: v >= 1, "an integer >= 1"),
    Check("max_failures", lambda v: v >= -1, "an integer >= -1 (-1 = retry forever)"),
    Check("cpus_per_worker", lambda v: v > 0, "a number of CPUs > 0"),
    Check("max_steps", lambda v: v is None or v >= 1, "null (the whole stream) or an integer >= 1"),
    Check("log_every", lambda v: v >= 1, "an integer >= 1 (steps)"),
    Check("report_every", lambda v: v >= 1, "an integer >= 1 (steps)"),
    Check("run_name", lambda v: v is None or is_path_name(v), f"null (a generated name) or {PATH_NAME}"),
    one_of("ray_log_level", RAY_LOG_LEVELS),
    Check("compile", lambda v: v is True or v is False or v == "auto", "true, false or auto (auto: on CUDA only)"),
    Check("correlation_steps", lambda v: v >= 0, "an integer >= 0 (pairs of batches; 0 = no measurement)"),
    Check("collective_timeout_s", lambda v: v >= 1, "an integer >= 1 (seconds)"),
    Check("correlation_micro_batch", lambda v: v is None or v >= 1,
          "null (the worker's training batch) or an integer >= 1 (clips per forward pass)"),
]
