"""raystream: learning from streaming video with orthogonal gradients, on Ray Train, Ray Tune and MLflow.

Its packages, top to bottom of the layers (pyproject.toml's [tool.importlinter]; each imports only those below it):
    cli.py             the `raystream` command: Hydra overrides, then each subcommand's flags
    study/             `raystream report`: finished sweeps read back from MLflow, tables and plots
    tune/              Ray Tune sweeps from sweep files, one MLflow parent run per sweep; `raystream plan`
    bench/             `raystream bench` and the GPU campaign: what one node does (no Ray, no MLflow)
    train/             one run as a Ray Train V2 job: driver, worker loop, checkpoints; `raystream eval`
    config/            the composed run config: Hydra onto structured dataclasses, then the range checks
    tracking/          MLflow recording: runs, names, the event record, LoggedModels
    models/            ViT backbones and the paper's scenarios (VideoMAE, future prediction, DoRA)
    eval/              probes of frozen models (kNN, linear, attentive) and pixel metrics
    data/              decoded video clip streams in the paper's batching orders, sharded and resumable
    optim/             the paper's optimizers (Orthogonal-AdamW, Orthogonal-SGD, Slower-AdamW), pure torch
    schedule.py        warm-up then cosine by step, for training and the probes
    checks.py          range checks of config values, declared by the package owning each section
    uris.py            object-store URIs (s3://, gs://) opened as pyarrow filesystems
    diskspace.py       a write that failed for want of space, named with the path and the space
    config_tree.py     where the Hydra config tree is: the shipped one, then a user's directories
    markdown_table.py  the one writer of Markdown tables
"""

__version__ = "0.1.0"
