"""raystream.tune: Ray Tune sweeps from Hydra sweep files, one MLflow parent run per sweep.

    raystream.tune.sweep.run_sweep(cfg, overrides, fit=None) -> SweepOutcome
`raystream sweep <overrides>` (default sweep=smoke) runs it and prints its summary and exit code (raystream/cli.py).
The report a sweep prints (`raystream report`) only reads MLflow: raystream/study/report.py.

A sweep:
    sweep.py           `raystream sweep`: plan -> lock -> parent run -> Tuner -> outcomes; resume
    space.py           a composed config -> the sweep's grid cells, each a fully composed, checked config
    cell_checks.py     what a sweep checks before Ray starts, for every cell together
    searcher.py        grid x Optuna: every grid cell, Optuna's samples inside each
    concurrency.py     how many trials a sweep keeps in flight; what one trial's Train run holds
    trial.py           one trial: its config, its Train run, its failure recorded
    sweep_run.py       the sweep's MLflow parent run: created or resumed, what it carries
    console.py         the sweep's progress lines on the terminal
    release.py         a stopped trial's Train workers given back to the cluster
What a sweep runs and spends (issue 68):
    study_search.py    the trials it reuses, the searcher it runs, given what has run and what it may spend
    identity.py        a trial's identity: what determines its result, so a finished trial never runs twice
    adaptive.py        seeds until the answer is known: seeds added round by round to the cells still undecided
    budget.py          sweep.budget / budget_cost: GPU-hours or cost, checked against the plan
    budget_search.py   the budget kept while the sweep runs (BudgetSearcher)
`raystream plan`:
    plan.py            what a run or a sweep will cost before it is submitted: steps, trials, concurrency, totals
    rates.py           the measured rates (a bench file, the shipped H200 campaign) and the rate model
    plan_text.py       what `raystream plan` prints
    plan_measured.py   a whole trial's time measured from trials already run (an extended or resumed sweep)
The `sweep` section's schema is raystream/config/sweep.py; the parent run's MLflow bookkeeping is
raystream/tracking/parent.py.
Importing this package starts no Ray.
"""
