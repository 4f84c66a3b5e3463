"""The budget kept while a sweep runs (issue 68): `BudgetSearcher` wraps the sweep's Ray Tune Searcher and starts a
trial only when the spend so far, the estimates of the trials running and its own estimate stay within the budget
(`raystream.tune.budget.Ledger`); otherwise the search ends, naming the cells it did not run.
"""

from __future__ import annotations

from typing import Dict, Optional

from ray.tune.search import Searcher

from raystream.tune.budget import Ledger
from raystream.tune.searcher import CELL_KEY


class BudgetSearcher(Searcher):
    """Any of the sweep's searchers (`next_cell()`: the cell its next suggestion would run, None when it has none
    now; `remaining()`: the cells it would still run) with the budget kept: a trial that would pass it is not
    started; while trials run, the search waits (they may spend less than estimated); when none runs, it ends."""

    def __init__(self, searcher: Searcher, ledger: Ledger):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.ledger = ledger

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Optional[Dict]:
        if self.ledger.stopped:
            return Searcher.FINISHED
        cell = self.searcher.next_cell()
        if cell is not None and not self.ledger.fits(cell):
            if self.ledger.running:
                return None  # ask again when a running trial ends
            self.ledger.stopped = True
            self.ledger.not_run = list(self.searcher.remaining())
            return Searcher.FINISHED
        config = self.searcher.suggest(trial_id)
        if isinstance(config, dict):
            self.ledger.start(trial_id, cell if cell is not None else int(config.get(CELL_KEY, 0)))
        return config

    def on_trial_result(self, trial_id: str, result: Dict) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        self.ledger.finish(trial_id, (result or {}).get("time_total_s"))
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    # A wrapper to Ray (it has `.searcher`, as ConcurrencyLimiter): Tune saves the wrapped searcher on its own and
    # this state beside it, so a resumed sweep keeps what the earlier sessions spent.
    def get_state(self) -> Dict:
        return {"ledger": self.ledger}

    def set_state(self, state: Dict) -> None:
        self.ledger = state["ledger"]
