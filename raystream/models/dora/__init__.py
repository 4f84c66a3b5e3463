"""DoRA on a single long video (paper Table 1; Venkataramanan et al. ICLR 2024) as the scenario `dora`.

    scenario.py           the `dora` scenario: its builder (scenario.*, scenario.dora.*, stream.*) and Scenario
    model.py              the DoRA model (the nn.Module)
    augment.py            seeded views of a clip, the same for a sample on every rank
    tracking.py           object discovery and tracking on the teacher, masks (after the official utils.MOT)
    sinkhorn.py           Sinkhorn-Knopp: balanced assignment of a frame's patches to the object prototypes
    head.py               DINO's projection head
    loss.py               the DINO loss and its centre (the official code's quirks)
    teacher.py            the EMA teacher, held in buffers, and its momentum schedule
"""

from raystream.models.dora.model import DoRA
from raystream.models.dora.scenario import DoraScenario, build_dora

__all__ = ["DoRA", "DoraScenario", "build_dora"]
