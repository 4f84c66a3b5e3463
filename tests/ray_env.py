"""The Ray settings every test's Ray runs take (tests/conftest.py sets them for the session; the tests that build a
driver's environment from scratch add them back).

- The Train controller polls its workers every 2 s by default; tiny test runs finish faster at 0.25 s.
- Two things every Ray Train run does that no test reads cost a few CPU-seconds of a run's ~30 on the 2 shared
  cores: a preemption watcher (one more actor: one more Python process importing ray.train) and the JSON logs of
  the controller and workers. Users' runs keep Ray's defaults.
- torch.compile's inductor compiles its kernels in a pool of subprocesses by default, each one importing torch: on
  2 shared cores the pool is pure cost (a cold compile of tests/optim/test_optim_compiled.py: 131 CPU-seconds with
  it, 105 without). Not a Ray setting, but every process that compiles (the pytest workers, Ray's workers, the
  CLI's drivers) takes it from here.

`SESSION_CLUSTER_ENV` is for the processes of the session's Ray cluster alone (tests/conftest.py `ray_cluster`: its
raylet, so every Ray worker it starts, and not the pytest process): torch.compile's graphs there are built by
dynamo and AOT autograd and run by `aot_eager`, not lowered to C++ by inductor (torch's own per-graph backend
override, TORCH_COMPILE_OVERRIDE_BACKENDS). The one Ray run of the suite that compiles, the compiled optimizer's
(tests/train/test_loop_paths.py), still traces its step whole (fullgraph) in a Ray worker and trains through it; its
inductor C++ build, which took 5-6 times as long on 2 loaded cores (a step of 200 s against 32 s, 2026-12-07), is
tested in the pytest process (tests/optim/test_optim_compiled.py: the same step function against Algorithm 2's
reference and the stock path). A torch without the override compiles with inductor there, as before: slower, not
wrong.
"""

RAY_TEST_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING": "0",
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}

SESSION_CLUSTER_ENV = {
    "TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager",  # every graph: dynamo + AOT autograd, no inductor C++ build
}
