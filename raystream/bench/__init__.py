"""raystream.bench: `raystream bench`, what one node does with the configured experiment. No Ray, no MLflow.

    raystream bench [overrides] [--device cpu|cuda] [--steps N] [--json PATH] [--time-budget S] [--compile auto|on|off]

It trains the configured scenario and optimizer as one training worker does (its per-worker batch, its torch
threads, the shared step of raystream/train/step.py) and reports: steps/s and clips/s from batches held in device
memory and from the live stream, the decode workers the stream needs to keep up, the optimizer step against torch's
AdamW (foreach and fused), the peak memory of a step, and, before any timing, checks of the CUDA path.

Where things live: `trainee.py` (the model, optimizer and streams, built as a worker builds them; the time budget),
`checks.py` (the checks before timing), `throughput.py` (timed steps, the decode-worker sweep), `optimizer_timing.py`
(the optimizer step alone), `memory.py` (peak device memory), `report.py` (the table and the JSON object),
`main.py` (the command).
"""
