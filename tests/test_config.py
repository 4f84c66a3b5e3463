"""The composed config: shipped files compose, bad keys and values fail before Ray starts, naming the key."""

import re

import pytest

from raystream.config import ConfigError, compose, flatten


def test_default_config_composes_with_every_group():
    cfg = compose([])
    assert cfg.stream.order == "batch_along_time"
    assert cfg.optimizer.name == "orthogonal_adamw"
    assert cfg.scenario.name == "videomae"


def test_group_choice_and_key_override():
    cfg = compose(["optimizer=adamw", "stream.order=shuffled", "stream.batch_size=4"])
    assert cfg.optimizer.name == "adamw"
    assert cfg.stream.order == "shuffled"
    assert cfg.stream.batch_size == 4


@pytest.mark.parametrize(
    "override, key",
    [
        ("stream.order=sideways", "stream.order"),
        ("stream.bogus=1", "stream.bogus"),
        ("optimizer=nope", "optimizer/nope"),
        ("stream.batch_size=abc", "stream.batch_size"),
        ("optimizer.orth_beta=1.0", "optimizer.orth_beta"),
        ("optimizer.projection=diagonal", "optimizer.projection"),
        ("trainer.num_workers=3", "stream.batch_size"),
        ("optimizer.warmup_steps=-1", "optimizer.warmup_steps"),
        ("optimizer.min_lr_ratio=1.5", "optimizer.min_lr_ratio"),
        ("optimizer.grad_clip=-1", "optimizer.grad_clip"),
        ("data.decord_reset_frames=-1", "data.decord_reset_frames"),
        ("data.read_ahead=maybe", "data.read_ahead"),
        ("data.decode_backend=fork", "data.decode_backend"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


def test_flatten_gives_dotted_params():
    flat = flatten(compose([]))
    assert flat["optimizer.orth_beta"] == 0.9
    assert flat["stream.order"] == "batch_along_time"
    assert all(not isinstance(v, dict) for v in flat.values())


@pytest.mark.parametrize(
    "override, key",
    [
        ("+optimizer.lrr=1", "optimizer.lrr"),  # `+` adds a key Hydra does not check against the schema
        ("+lrr=1", "lrr"),
        ("optimizer.lr=inf", "optimizer.lr"),
        ("optimizer.lr=nan", "optimizer.lr"),
        ("trainer.run_name=..", "trainer.run_name"),
        ("trainer.run_name=.", "trainer.run_name"),
        ("sweep.run_name=../../escaped", "sweep.run_name"),
        ("sweep.run_name=a/b", "sweep.run_name"),
        ("data.demo.canvas=48", "data.demo.canvas"),
        ("data.demo.canvas=16", "data.demo.canvas"),
        ("optimizer.compile=maybe", "optimizer.compile"),
    ],
)
def test_guard_holes_are_closed(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose([override])


def test_optimizer_compile_takes_true_false_or_auto():
    with pytest.raises(ConfigError, match=r"optimizer\.compile.*expected true, false or auto"):
        compose(["optimizer.compile=maybe"])
    assert [compose([f"optimizer.compile={v}"]).optimizer.compile for v in ("true", "false", "auto")] == \
        [True, False, "auto"]
    assert compose([]).optimizer.compile == "auto"


@pytest.mark.parametrize("overrides", [["optimizer=adamw", "optimizer.compile=true"],
                                       ["optimizer.compile=true", "optimizer.projection=dim0"]])
def test_the_compiled_step_is_asked_for_only_where_it_exists(overrides):
    with pytest.raises(ConfigError, match=r"config key `optimizer` = .*expected compile: true only with name: "
                                          r"orthogonal_adamw and projection: global or per_tensor"):
        compose(overrides)
    assert compose(overrides[:1] + ["optimizer.compile=false"] + overrides[2:]).optimizer.compile is False


def test_optimizer_triton_takes_true_false_or_auto_and_true_only_where_the_fused_step_runs():
    with pytest.raises(ConfigError, match=r"optimizer\.triton.*expected true, false or auto"):
        compose(["optimizer.triton=maybe"])
    assert compose([]).optimizer.triton == "auto"
    assert compose(["optimizer.triton=false"]).optimizer.triton is False
    assert compose(["optimizer.triton=true"]).optimizer.triton is True  # `raystream bench --device cuda` takes it
    for other in (["optimizer=adamw"], ["optimizer.projection=dim0"], ["optimizer.compile=true"]):
        with pytest.raises(ConfigError, match=r"expected triton: true only with name: orthogonal_adamw, compile: "
                                              r"false or auto and projection: global or per_tensor"):
            compose(other + ["optimizer.triton=true", "trainer.use_gpu=true"])


def test_a_wrong_type_keeps_its_reason():
    with pytest.raises(ConfigError, match=r"trainer.max_steps=abc.*'abc' of type 'str' could not be converted"):
        compose(["trainer.max_steps=abc"])


@pytest.mark.parametrize("override, nearest", [
    ("seed=0", "trainer.seed"),  # a top-level key that is a section's: that section's, the most often set first
    ("+max_steps=3", "trainer.max_steps"),  # with `+` too (a key Hydra would add)
    ("optimizer.lrr=1e-3", "optimizer.lr"),  # a misspelt name in its section
    ("trainer.sed=1", "trainer.seed"),
])
def test_an_unknown_key_suggests_the_nearest(override, nearest):
    with pytest.raises(ConfigError, match=f"did you mean {re.escape(nearest)}[ ?]"):
        compose([override])


def test_sweep_axes_are_set_from_the_command_line_with_or_without_plus():
    cfg = compose(["sweep=paper_table", "sweep.grid.trainer.seed=[0]", "+sweep.grid.data=[moving_digits]",
                   "~sweep.grid.stream.order", "sweep.sample.optimizer.lr='loguniform(1e-4,1e-3)'"])
    assert dict(cfg.sweep.grid) == {"optimizer.name": ["adamw", "orthogonal_adamw"], "trainer.seed": [0],
                                    "data": ["moving_digits"]}
    assert cfg.sweep.sample["optimizer.lr"] == "loguniform(1e-4,1e-3)"
    with pytest.raises(ConfigError, match=r"no grid axis `stream\.ordr`"):
        compose(["sweep=paper_table", "~sweep.grid.stream.ordr"])
    with pytest.raises(ConfigError, match=r"sweep\.grid\.trainer\.seed"):
        compose(["sweep.grid.trainer.seed=[]"])


def test_the_smallest_demo_canvas_the_check_accepts_is_one_decord_reads(tmp_path):
    """The canvas bound is measured: 18 (the smallest accepted) and 32 decode, 48 (rejected) does not."""
    import decord

    from raystream.data.config import DECORD_UNREADABLE_CANVAS
    from raystream.data.demo.videos import ensure_demo_videos

    def frames(canvas):
        cfg = compose([f"data.demo.cache_dir={tmp_path / str(canvas)}", "data.demo.frames_per_video=8",
                       "data.demo.num_videos=1"]).data.demo
        cfg.canvas = canvas  # bypass the check to try the encoded result
        return decord.VideoReader(str(ensure_demo_videos(cfg)[0])).get_batch(list(range(8))).shape

    assert frames(18) == (8, 18, 18, 3)
    assert 48 in DECORD_UNREADABLE_CANVAS
    with pytest.raises(decord.DECORDError):
        frames(48)
    with pytest.raises(ConfigError, match=r"data\.demo\.canvas"):
        compose(["data.demo.canvas=17"])

