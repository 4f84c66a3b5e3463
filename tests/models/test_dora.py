"""DoRA's parts: Sinkhorn-Knopp, object tracking masks, the EMA teacher, the DINO loss and its centre, the config.

The model is an image ViT-tiny shrunk further (48 wide, 2 blocks, 3 heads) on 32 px clips of 2 frames, so every
test here runs in well under a second of CPU.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from raystream.data.config import StreamConfig
from raystream.models import build_scenario
from raystream.models.config import ScenarioConfig
from raystream.models.dora.augment import make_views
from raystream.models.dora.loss import DoraLoss
from raystream.models.dora.sinkhorn import sinkhorn_knopp
from raystream.models.dora.teacher import cosine_momentum
from raystream.models.dora.tracking import discover_objects, mask_clips
from raystream.models.pixels import normalize_input


def dora_cfg(**dora) -> ScenarioConfig:
    cfg = ScenarioConfig(name="dora")
    cfg.backbone.tubelet_size = 1
    cfg.backbone.embed_dim, cfg.backbone.depth, cfg.backbone.num_heads = 48, 2, 3
    cfg.dora.out_dim, cfg.dora.hidden_dim, cfg.dora.bottleneck_dim = 32, 32, 16
    for key, value in dora.items():
        setattr(cfg.dora, key, value)
    return cfg


def build(**dora):
    return build_scenario(dora_cfg(**dora), StreamConfig(frames_per_clip=2, resolution=32), seed=0)


def clips(b=4, t=2, seed=0):
    """Smooth random blobs: an image with structure, so attention is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    out = torch.zeros(b, t, 3, 32, 32)
    for i in range(b):
        for _ in range(3):
            cy, cx = torch.rand(2, generator=g) * 32
            colour = torch.rand(3, 1, 1, generator=g)
            blob = torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 40.0)
            out[i] += colour * blob
    for f in range(1, t):  # later frames: the same scene shifted by a pixel per frame
        out[:, f] = torch.roll(out[:, 0], shifts=f, dims=-1)
    return out.clamp(0, 1)


def batch(frames, step=0, index=None):
    index = torch.arange(frames.shape[0]) if index is None else torch.as_tensor(index)
    return {"frames": frames, "target": None, "index": index, "step": step}


# ------------------------------------------------------------------------------------------------ Sinkhorn


def official_sinkhorn(logits, epsilon=0.05, iters=30):
    """The official DoRA SinkhornKnopp (exp domain), transcribed, for comparison where it is finite."""
    q = logits / epsilon
    q = q - q.amax(dim=(-1, -2), keepdim=True)
    q = torch.exp(q).transpose(-2, -1)  # (B, K, N)
    q = q / q.sum(dim=(-1, -2), keepdim=True)
    n, k = q.shape[2], q.shape[1]
    for _ in range(iters):
        q = q / q.sum(dim=2, keepdim=True) / k
        q = q / q.sum(dim=1, keepdim=True) / n
    return (q * n).transpose(-2, -1)


def test_sinkhorn_is_doubly_stochastic():
    g = torch.Generator().manual_seed(0)
    square = sinkhorn_knopp(torch.randn(2, 6, 6, generator=g, dtype=torch.float64) * 0.05)
    assert torch.allclose(square.sum(-1), torch.ones(2, 6, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(square.sum(-2), torch.ones(2, 6, dtype=torch.float64), atol=1e-6)
    assert (square >= 0).all()
    # N patches, K prototypes: each patch sums to 1, each prototype gets N / K
    logits = torch.randn(3, 16, 3, generator=g, dtype=torch.float64) * 0.05
    q = sinkhorn_knopp(logits)
    assert torch.allclose(q.sum(-1), torch.ones(3, 16, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(q.sum(-2), torch.full((3, 3), 16 / 3, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(q, official_sinkhorn(logits), atol=1e-8)
    # it rebalances: a prototype that every patch prefers still gets only N / K
    skewed = logits.clone()
    skewed[..., 0] += 0.2
    assert torch.allclose(sinkhorn_knopp(skewed).sum(-2), torch.full((3, 3), 16 / 3, dtype=torch.float64),
                          atol=1e-3)


def test_sinkhorn_survives_large_logits():
    """exp(logits / 0.05) overflows float32 for logits ~ 5; the log-domain version stays finite."""
    q = sinkhorn_knopp(torch.randn(2, 16, 3) * 20.0)
    assert torch.isfinite(q).all()
    assert torch.allclose(q.sum(-1), torch.ones(2, 16), atol=1e-4)


# ------------------------------------------------------------------------------------------------ tracking


def test_tracking_masks_have_the_frame_shape_and_select_some_patches():
    model = build().model
    frames = normalize_input(clips(b=3, t=2))
    logits, masks = model.track(frames, heads=[0, 1, 2])
    assert logits.shape == (3, 2, 32)
    assert masks.shape == (3, 3, 2, 4, 4) and masks.dtype == torch.bool  # (B, K, T, 32/8, 32/8)
    selected = masks.flatten(-2).sum(-1)
    assert (selected > 0).all() and (selected < 16).all(), selected
    masked = mask_clips(frames, masks, patch_size=8)
    assert masked.shape == (3,) + frames.shape  # one masked clip per object, each of the frame's shape
    pixel = masks.repeat_interleave(8, -2).repeat_interleave(8, -1).permute(1, 0, 2, 3, 4).unsqueeze(3)
    assert torch.equal(masked, torch.where(pixel, frames.unsqueeze(0), torch.zeros(())))
    assert not torch.equal(masks[:, 0], masks[:, 1]) or not torch.equal(masks[:, 1], masks[:, 2])


def test_object_discovery_picks_heads_without_an_index_tensor():
    """The chosen heads' attention maps are read as views: indexing by a list makes an index tensor that a GPU
    copies and waits for at every step (the H200 campaign of 2026-11-27 counted it: DoRA's one sync per step)."""
    g = torch.Generator().manual_seed(0)
    cls_attn, query, feats = (torch.rand(2, 6, 16, generator=g), torch.randn(2, 16, 8, generator=g),
                              torch.randn(2, 16, 8, generator=g))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        prototypes = discover_objects(cls_attn, query, feats, heads=[4, 1, 3], iterations=3)
    assert not [e.name for e in prof.events() if e.name in ("aten::index", "aten::lift_fresh")]
    maps = cls_attn[:, [4, 1, 3]]  # what the views must equal
    unit = F.normalize(feats, dim=-1)
    expected = sinkhorn_knopp(unit @ torch.einsum("bkn,bnd->bkd", maps, query).transpose(-2, -1), 0.05, 3)
    expected = expected.transpose(-2, -1) @ unit
    assert torch.allclose(prototypes, expected, atol=1e-6)


# ------------------------------------------------------------------------------------------------ teacher


def test_teacher_gets_no_gradients_and_moves_only_by_ema():
    scenario = build()
    model = scenario.model
    params = {id(p) for p in model.parameters()}
    teacher = dict(model.teacher.named_buffers())
    assert teacher and not any(id(t) in params for t in teacher.values())  # the optimizer cannot see it
    state = model.state_dict()
    assert "teacher.backbone.cls_token" in state and "criterion.center" in state  # checkpoints hold it
    for name, p in model.student.named_parameters():
        assert torch.equal(teacher[name], p)  # starts equal

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    out = model(batch(clips()))
    out["loss"].backward()
    assert all(t.grad is None and not t.requires_grad for t in teacher.values())
    assert model.student.backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    before = {k: v.clone() for k, v in teacher.items()}
    opt.step()
    assert all(torch.equal(before[k], v) for k, v in model.teacher.named_buffers())  # the step moved the student only
    scenario.set_total_steps(10)
    scenario.after_step(3)
    m = cosine_momentum(3, 10)
    assert scenario.momentum == pytest.approx(m) and 0.996 < m < 1
    for name, p in model.student.named_parameters():
        expected = m * before[name] + (1 - m) * p.detach()
        assert torch.allclose(dict(model.teacher.named_buffers())[name], expected, atol=1e-6), name


def test_momentum_schedule_and_checkpoint_round_trip():
    assert cosine_momentum(0, 100) == pytest.approx(0.996)
    assert cosine_momentum(50, 100) == pytest.approx(0.998)
    assert cosine_momentum(100, 100) == pytest.approx(1.0)
    values = [cosine_momentum(t, 100) for t in range(101)]
    assert values == sorted(values)

    scenario = build()
    scenario.model(batch(clips()))["loss"].backward()
    with torch.no_grad():
        for p in scenario.model.student.parameters():
            p.add_(0.01)
    scenario.after_step(0)
    restored = build()
    restored.model.load_state_dict(scenario.model.state_dict())
    for (name, a), b in zip(scenario.model.state_dict().items(), restored.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert scenario.model.criterion.center.abs().sum() > 0  # the centre moved and was restored


def test_freeze_last_layer_zeroes_its_gradient_only_while_frozen():
    model = build(freeze_last_layer_steps=1).model
    last = model.student.head.last_layer.weight_v
    model(batch(clips(), step=0))["loss"].backward()
    assert last.grad is not None and last.grad.abs().sum() == 0
    last.grad = None
    model(batch(clips(), step=1))["loss"].backward()
    assert last.grad.abs().sum() > 0


def test_loss_is_a_mean_over_samples_so_any_sharding_gives_the_same_gradient():
    """Views and masks are drawn from (seed, step, global index): two half batches average to the full one."""
    model = build().model.eval()  # eval: no centre update between the calls
    frames = clips(b=4)
    with torch.no_grad():
        full = model(batch(frames, step=5))["loss"]
        half_a = model(batch(frames[:2], step=5, index=[0, 1]))["loss"]
        half_b = model(batch(frames[2:], step=5, index=[2, 3]))["loss"]
    assert torch.allclose(full, (half_a + half_b) / 2, atol=1e-5)


# ------------------------------------------------------------------------------------------------ loss and centre


def ce(p, s, temp):
    return float(-(p * F.log_softmax(s / temp, dim=-1)).sum())


def test_center_update_matches_a_hand_computation():
    loss = DoraLoss(3, center_momentum=0.9)
    a = torch.tensor([[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]])  # (B=1, T=2, D=3)
    loss.update_center(a)
    c1 = 0.1 * torch.tensor([2.0, 2.0, 2.0])
    assert torch.allclose(loss.center, c1.view(1, 3))
    b = torch.tensor([[[0.0, 0.0, 6.0]], [[0.0, 3.0, 0.0]]])  # (B=2, T=1, D=3)
    loss.update_center(b)
    assert torch.allclose(loss.center, (0.9 * c1 + 0.1 * torch.tensor([0.0, 1.5, 3.0])).view(1, 3))


def test_loss_rules_match_hand_computations():
    g = torch.Generator().manual_seed(1)
    b, t, d, k, n_local = 2, 3, 5, 3, 3
    teacher = torch.randn(b, t, d, generator=g)
    masked = torch.randn(k, b, t, d, generator=g)
    local = torch.randn(n_local, b, t, d, generator=g)
    center = torch.randn(1, d, generator=g)
    p = F.softmax((teacher - center) / 0.04, dim=-1)

    paper = DoraLoss(d, rule="paper")
    paper.center.copy_(center)
    got = paper(teacher, masked, local, update_center=False)
    mask_term = sum(ce(p[i, f], masked[j, i, f], 0.1) for j in range(k) for i in range(b) for f in range(t))
    local_term = sum(ce(p[i, f], local[v, i, f], 0.1) for v in range(n_local) for i in range(b) for f in range(t))
    expected = 0.5 * mask_term / (k * b * t) + 0.5 * local_term / (n_local * b * t)
    assert float(got) == pytest.approx(expected, rel=1e-5)

    # the official loop, transcribed (main.py DINOLoss.forward with global_crop=1): both quirks included
    total, frame_loss = 0.0, 0.0
    for j in range(k):
        for f in range(t):
            q = p[:, f]
            mask_loss = sum(ce(q[i], masked[j, i, f], 0.1) for i in range(b)) / b
            local_losses = [sum(ce(q[i], local[v, i, f], 0.1) for i in range(b)) / b for v in range(n_local) if v != 0]
            frame_loss += (mask_loss + sum(local_losses) / len(local_losses)) * 0.5
        frame_loss /= t
        total += frame_loss
    total /= k
    official = DoraLoss(d, rule="official")
    official.center.copy_(center)
    assert float(official(teacher, masked, local, update_center=False)) == pytest.approx(total, rel=1e-5)
    assert not math.isclose(total, expected, rel_tol=1e-3)


def _center_worker(rank, world, path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        loss = DoraLoss(2, center_momentum=0.5)
        teacher = torch.full((1 + rank, 1, 2), float(rank + 1))  # rank 0: one row of 1s; rank 1: two rows of 2s
        loss.update_center(teacher)
        torch.save(loss.center, f"{path}.{rank}")
    finally:
        dist.destroy_process_group()


def test_two_global_views_loss_matches_a_hand_computation():
    """DINO's cross-view rule on 2 teacher views and 3 student views (view 0's and view 1's masked clip, 1 local
    crop), B = T = K = 1, 4-dim outputs, both temperatures 1 and a zero centre. Logits are logs of counts, so each
    softmax is counts / sum and every cross-entropy is a multiple of ln 2:
      P_0 = softmax(0, 0, 0, 0) = (1/4, 1/4, 1/4, 1/4);   P_1 = softmax(log (1, 1, 1, 5)) = (1/8, 1/8, 1/8, 5/8)
      log q(masked_0) = log (1, 1, 2, 4) / 8 = ln 2 (-3, -3, -2, -1)
      log q(masked_1) = log (1, 1, 1, 1) / 4 = ln 2 (-2, -2, -2, -2)
      log q(local)    = log (4, 2, 1, 1) / 8 = ln 2 (-1, -2, -3, -3)
    Terms (teacher view g, student view v != g): H(P_0, masked_1) = 2 ln 2; H(P_0, local) = 9/4 ln 2;
    H(P_1, masked_0) = (3 + 3 + 2 + 5) / 8 ln 2 = 13/8 ln 2; H(P_1, local) = (1 + 2 + 3 + 15) / 8 ln 2 = 21/8 ln 2.
    Mean of the 4 terms: (16 + 18 + 13 + 21) / 32 ln 2 = 17/8 ln 2. Centre: 0.1 * mean(t_0, t_1) = (0, 0, 0, ln 5 / 20).
    """
    log = lambda *counts: torch.log(torch.tensor(counts))  # noqa: E731
    teacher = torch.stack([log(1.0, 1, 1, 1), log(1.0, 1, 1, 5)]).view(2, 1, 1, 4)  # (G, B, T, D)
    masked = torch.stack([log(1.0, 1, 2, 4), log(1.0, 1, 1, 1)]).view(2, 1, 1, 1, 4)  # (G, K, B, T, D)
    local = log(4.0, 2, 1, 1).view(1, 1, 1, 4)  # (L, B, T, D)
    loss = DoraLoss(4, student_temp=1.0, teacher_temp=1.0, center_momentum=0.9)
    got = loss.forward_views(teacher, masked, local)
    assert float(got) == pytest.approx(17 / 8 * math.log(2), rel=1e-6)
    assert torch.allclose(loss.center, torch.tensor([[0.0, 0.0, 0.0, math.log(5) / 20]]))


def test_one_global_crop_gives_the_loss_of_before_two_global_crops():
    """global_crops 1 is DoRA as before this option: the same step's loss as the code before it gave (pinned:
    2.1977810859680176 at commit 4c88f77) and forward_views on one view is forward. Two crops: a second,
    different global view, a finite loss with gradients on the student, and a centre from both views."""
    torch.manual_seed(0)
    one = build(local_crops=2)
    out = one.model(batch(clips(), step=3))
    assert out["loss"].item() == pytest.approx(2.1977810859680176, rel=1e-5)
    crit = one.model.criterion
    t, m, loc = torch.randn(1, 2, 2, 32), torch.randn(1, 3, 2, 2, 32), torch.randn(2, 2, 2, 32)
    assert float(crit.forward_views(t, m, loc, update_center=False)) == float(crit(t[0], m[0], loc, update_center=False))

    two = build(local_crops=2, global_crops=2)
    views, _ = make_views(clips(), [0, 1, 2, 3], seed=0, step=3, cfg=two.model.cfg, local_size=16)
    assert views.shape[0] == 2 and not torch.allclose(views[0], views[1])
    views_one, _ = make_views(clips(), [0, 1, 2, 3], seed=0, step=3, cfg=one.model.cfg, local_size=16)
    assert torch.equal(views_one[0], views[0])  # view 0 is the one-crop view; view 1 comes from its own stream
    out = two.model(batch(clips(), step=3))
    assert torch.isfinite(out["loss"]) and out["loss"].item() != pytest.approx(2.1977810859680176, rel=1e-3)
    out["loss"].backward()
    grads = [p.grad for p in two.model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    assert two.model.criterion.center.abs().sum() > 0


def test_center_update_with_a_process_group_of_one(tmp_path):
    """The all-reduce path in this process (world size 1) gives the single-process result."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        loss = DoraLoss(2, center_momentum=0.5)
        loss.update_center(torch.tensor([[[1.0, 3.0]], [[3.0, 5.0]]]))
    finally:
        dist.destroy_process_group()
    assert torch.allclose(loss.center, torch.tensor([[1.0, 2.0]]))


@pytest.mark.slow  # two processes each importing torch: ~5 s idle, 30 s on a loaded 2-core machine
def test_center_update_averages_over_all_processes(tmp_path):
    """With a process group the centre uses the global batch: (1 + 2 + 2) / 3 rows, on every rank."""
    import torch.multiprocessing as mp

    path = str(tmp_path / "pg")
    mp.spawn(_center_worker, args=(2, path), nprocs=2, join=True)
    for rank in range(2):
        center = torch.load(f"{path}.{rank}", weights_only=True)
        assert torch.allclose(center, torch.full((1, 2), 0.5 * 5 / 3))


# ------------------------------------------------------------------------------------------------ config


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="scenario.dora.loss_rule"):
        build(loss_rule="dino")
    with pytest.raises(ValueError, match="scenario.dora.num_objects"):
        build(num_objects=4)  # more objects than the backbone's 3 heads
    cfg = dora_cfg()
    cfg.backbone.tubelet_size = 2
    with pytest.raises(ValueError, match="scenario.backbone.tubelet_size"):
        build_scenario(cfg, StreamConfig(frames_per_clip=2, resolution=32))


def test_paper_preset_constructs_vit_small():
    from raystream.config import compose

    cfg = compose(["+experiment=dora_paper", "data.videos=venice.mp4", "eval.dataset=probe"])
    assert (cfg.stream.frames_per_clip, cfg.stream.fps, cfg.stream.batch_size, cfg.stream.resolution) == (8, 1, 32, 224)
    assert cfg.optimizer.lr == pytest.approx(5e-4) and cfg.optimizer.weight_decay == pytest.approx(0.04)
    with torch.device("meta"):  # shapes and counts only: no 88M-value allocation on the CI machine
        scenario = build_scenario(cfg.scenario, cfg.stream, seed=0)
    model = scenario.model
    backbone = sum(p.numel() for p in model.student.backbone.parameters())
    assert 21.5e6 < backbone < 22.1e6, backbone  # ViT-S/16: 21.7M
    assert model.student.head.last_layer.weight_v.shape == (65536, 256)
    assert model.local_size == 112 and int(cfg.scenario.dora.local_crops) == 6
    assert sum(b.numel() for n, b in model.named_buffers() if n.startswith("teacher.")) == \
        sum(p.numel() for p in model.student.parameters())
    assert "dora" == scenario.name and scenario.needs == frozenset({"probe"})


def test_probes_read_the_teacher_backbone():
    model = build().model
    x = clips(b=2)
    features, tokens = model.encode(x)
    assert features.shape == (2, 48) and tokens.shape == (2, 2 * 17, 48)  # [CLS] + 16 patches per frame
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(1.0)
    assert torch.equal(model.encode(x)[0], features)  # the student does not matter
    with torch.no_grad():
        model.teacher.backbone.norm.bias.add_(1.0)
    assert not torch.equal(model.encode(x)[0], features)


def test_backbone_init_loads_student_and_teacher(tmp_path):
    donor = build_scenario(dora_cfg(), StreamConfig(frames_per_clip=2, resolution=32), seed=7).model
    path = tmp_path / "vit.pt"
    torch.save(donor.student.backbone.state_dict(), path)  # bare ViT keys, as a DINO/DoRA backbone file
    cfg = dora_cfg()
    cfg.backbone.init = str(path)
    model = build_scenario(cfg, StreamConfig(frames_per_clip=2, resolution=32), seed=0).model
    for name, value in donor.student.backbone.state_dict().items():
        assert torch.equal(model.student.backbone.state_dict()[name], value)
        assert torch.equal(model.teacher.backbone.state_dict()[name], value), name
