"""The composed config: shipped files compose, bad keys and values fail before Ray starts, naming the key."""

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
