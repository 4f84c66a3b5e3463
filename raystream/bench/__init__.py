"""raystream.bench: `raystream bench`, what one node does with the configured experiment. No Ray, no MLflow.

    raystream bench [overrides] [--device cpu|cuda] [--steps N] [--json PATH] [--time-budget S] [--compile auto|on|off]

It trains the configured scenario and optimizer as one training worker does (its per-worker batch, its torch
threads, the shared step of raystream/train/step.py) and reports: steps/s and clips/s from batches held in device
memory and from the live stream, the decode workers the stream needs to keep up, the optimizer step against torch's
AdamW (foreach and fused), the peak memory of a step, and, before any timing, checks of the CUDA path.

    main.py               `raystream bench`: the phases in order on one time budget, then the table and the JSON
    trainee.py            the model, optimizer and streams, built as a worker builds them; the time budget
    checks.py             the checks before timing (DeviceStream, a bf16 step, the compiled optimizer step)
    throughput.py         timed steps from device memory and from the live stream; the decode-worker sweep
    optimizer_timing.py   the optimizer step alone: configured, compiled, AdamW foreach and fused
    memory.py             peak device and host memory of the correlation and of the training phase
    trial_parts.py        a trial outside its steps: process start, build, correlation, evaluation, checkpoint
    flops.py              model FLOPs per step, achieved TFLOP/s and MFU against the device's bf16 peak
    report.py             what it prints (the table) and writes (the JSON object, `--json PATH`)
    results.py            bench JSON read back and checked (`raystream plan --rate-from`); the shipped campaign's
    h200_campaign.json    the shipped H200 rates of `raystream plan` (package data, campaign.json's layout)
    decoders.py           `raystream bench --decoders`: frames/s per decoder, workers and backend
    eval_rates.py         `raystream bench --eval`: one evaluation worker's rates, the paper's evaluations' cost
    worker_steps.py       two training steps as a Ray Train worker takes them, without Ray (the campaign's `train`)
    campaign.py           the GPU campaign: every GPU claim measured in one command (`python -m ...campaign`)
    campaign_table.py     the campaign's Markdown (campaign.md)
"""
