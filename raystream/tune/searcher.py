"""Grid x Optuna: a Ray Tune searcher that runs every grid cell and, inside each cell, lets Optuna pick the sampled
axes for `num_samples` trials.

Why not `tune.grid_search` inside `OptunaSearch`'s space: Optuna cannot take grid axes (Ray refuses to convert
them), and one Optuna study over a categorical "optimizer" axis would let TPE starve the arms of the ablation the
sweep exists to compare. Here each cell owns its own `OptunaSearch` (TPE, seeded per cell), so every cell gets
exactly `num_samples` trials and each optimizer x order gets its own tuned learning rate, as in the paper's tables.
Cells are visited round-robin, so concurrent trials spread over cells and Optuna in a cell learns from the
cell's finished trials. With no sampled axes each cell runs `num_samples` times with the same config.

The searcher is a plain Ray `Searcher`: Tune saves it with the experiment state (pickled), so `Tuner.restore`
continues where an interrupted sweep stopped without re-suggesting finished trials.
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

# Key of the trial config that holds the grid cell's index (the rest are the dotted keys the trial sets).
CELL_KEY = "cell"


class PickledSearcher(Searcher):
    """A searcher whose whole state is its attributes: Tune saves it pickled with the experiment state."""

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__.copy(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


class GridOptunaSearcher(PickledSearcher):
    def __init__(self, cells: List[Dict[str, Any]], space: Dict[str, Any], num_samples: int,
                 metric: Optional[str] = None, mode: Optional[str] = None, seed: int = 0,
                 run_cells: Optional[List[int]] = None):
        """`cells`: grid values per cell (dotted key -> value); `space`: dotted key -> Optuna distribution;
        `run_cells`: the indices of the cells to run (default all; a cell whose trial finished before is reused,
        raystream/tune/identity.py)."""
        super().__init__(metric=metric, mode=mode)
        self._index = list(range(len(cells))) if run_cells is None else list(run_cells)
        self._cells = [dict(cells[i]) for i in self._index]
        self._space = dict(space)
        self._num_samples = int(num_samples)
        self._seed = int(seed)
        self._suggested = 0  # trials handed out so far, over all cells
        self._trial_cell: Dict[str, int] = {}
        self._optuna: Dict[int, OptunaSearch] = {}

    @property
    def total(self) -> int:
        return len(self._cells) * self._num_samples

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec) -> bool:
        if config:
            raise ValueError("GridOptunaSearcher takes its space from the sweep plan; pass no param_space")
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    def _cell_search(self, cell: int) -> OptunaSearch:
        if cell not in self._optuna:
            index = self._index[cell]
            self._optuna[cell] = OptunaSearch(space=self._space, metric=self._metric, mode=self._mode,
                                              seed=self._seed + index, study_name=f"cell{index}")
        return self._optuna[cell]

    def suggest(self, trial_id: str) -> Optional[Dict]:
        if self._suggested >= self.total:
            return Searcher.FINISHED
        cell = self._suggested % len(self._cells)
        self._suggested += 1
        self._trial_cell[trial_id] = cell
        config: Dict[str, Any] = {CELL_KEY: self._index[cell], **self._cells[cell]}
        if self._space:
            config.update(self._cell_search(cell).suggest(trial_id))
        return config

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        cell = self._trial_cell.get(trial_id)
        if cell is None or not self._space:
            return
        # A failed trial (no metric) is told to Optuna as FAIL, so TPE does not learn from it.
        self._cell_search(cell).on_trial_complete(trial_id, result=result, error=error or not result)

    def next_cell(self) -> Optional[int]:
        """The cell the next suggestion runs (None when every trial was suggested): read by the budget's wrapper
        (raystream.tune.budget_search) before it lets the trial start."""
        return None if self._suggested >= self.total else self._index[self._suggested % len(self._cells)]

    def remaining(self) -> List[int]:
        """The cells of the trials not suggested yet, in the order they would run."""
        return [self._index[i % len(self._cells)] for i in range(self._suggested, self.total)]

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        if len(self._index) != len(self._cells):  # saved before `run_cells` existed: it ran every cell
            self._index = list(range(len(self._cells)))
