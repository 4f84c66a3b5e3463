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
"""

RAY_TEST_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING": "0",
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}
