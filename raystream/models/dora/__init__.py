"""DoRA on a single long video (paper Table 1; Venkataramanan et al. ICLR 2024) as the scenario `dora`.

One file per role: sinkhorn.py (balanced assignment), tracking.py (object discovery, tracking, masks), head.py
(DINO projection head), loss.py (DINO loss, centre; the official code's quirks), teacher.py (EMA teacher in
buffers, momentum schedule), augment.py (seeded views), model.py (the nn.Module), scenario.py (the Scenario and
its builder, registered as `scenario.name=dora`).
"""

from raystream.models.dora.model import DoRA
from raystream.models.dora.scenario import DoraScenario, build_dora

__all__ = ["DoRA", "DoraScenario", "build_dora"]
