import pytest

from largebatch.config import check_config, derive, validate
from largebatch.config.typed import typed
from largebatch.errors import ConfigError, UserError
from tests.conftest import derived_of, tiny_config


def test_defaults_fill_in_and_ints_become_floats():
    cfg = validate(tiny_config(**{"optimizer.lr": 1}))
    assert cfg["optimizer"]["lr"] == 1.0 and isinstance(cfg["optimizer"]["lr"], float)
    assert cfg["partial_window"] == "drop"
    assert cfg["dist"]["backend"] == "auto"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("optimizer.weight_decy", 0.1, "did you mean 'optimizer.weight_decay'"),
        ("epochz", 3, "did you mean 'epochs'"),
        ("gradient_accumulation", 16, "accumulation is derived"),
        ("epochs", "ten", "expected an integer"),
        ("clip_grad_norm", True, "expected a number"),
        ("epochs", 0, "must be >= 1"),
        ("optimizer.lr", 0.0, "must be > 0"),
        ("mixup.prob", 1.5, "must be <= 1"),
        ("precision", "fp8", "allowed: 'auto', 'fp32', 'bf16', 'fp16'"),
        ("data.mean", [0.5], "one per channel"),
        ("micro_batch_size", 64, "larger than global_batch_size"),
        ("model.num_classes", 7, "data.num_classes is 4"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(key, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        check_config(typed(tiny_config(**{key: value})))
    assert info.value.key is not None


def test_required_key():
    cfg = tiny_config()
    del cfg["epochs"]
    with pytest.raises(ConfigError, match="epochs: is required"):
        validate(cfg)


def test_warmup_in_steps_and_epochs_is_an_error():
    with pytest.raises(ConfigError, match="not both"):
        validate(tiny_config(**{"lr_schedule.warmup_epochs": 1.0}))


def test_derived_numbers_and_warmup_epochs():
    cfg = validate(tiny_config(**{"lr_schedule.warmup_steps": None, "lr_schedule.warmup_epochs": 0.5, "epochs": 3}))
    d = derived_of(cfg, 2, 130)
    assert d["accumulation"] == 2  # 32 / (8 x 2)
    assert d["steps_per_epoch"] == 4  # floor(130 / 32)
    assert d["total_steps"] == 12
    assert d["warmup_steps"] == 2


def test_warmup_longer_than_training():
    cfg = validate(tiny_config(**{"lr_schedule.warmup_steps": 100}))
    with pytest.raises(UserError, match="warmup is 100 steps but training is 4 steps"):
        derive(typed(cfg), world_size=1, num_train_samples=128)


def test_lr_scaling_rules():
    cfg = validate(tiny_config(**{"lr_schedule.scaling": "sqrt", "lr_schedule.base_batch_size": 8}))
    assert derived_of(cfg, 1, 128)["peak_lr"] == pytest.approx(1e-3 * 2)  # sqrt(32 / 8)
    cfg = validate(tiny_config(**{"lr_schedule.scaling": "linear", "lr_schedule.base_batch_size": 8}))
    assert derived_of(cfg, 1, 128)["peak_lr"] == pytest.approx(1e-3 * 4)
    with pytest.raises(ConfigError, match="base_batch_size"):
        validate(tiny_config(**{"lr_schedule.scaling": "sqrt"}))


def test_sharding_layout_by_strategy():
    def layout(world, **dist):
        return {k: v for k, v in derived_of(tiny_config(dist=dist), world, 128).items() if k in ("strategy", "shard_size", "replicas")}

    assert layout(4) == {"strategy": "ddp", "shard_size": 1, "replicas": 4}
    assert layout(4, strategy="fsdp") == {"strategy": "fsdp", "shard_size": 4, "replicas": 1}
    assert layout(4, strategy="hsdp", shard_size=2) == {"strategy": "hsdp", "shard_size": 2, "replicas": 2}
    with pytest.raises(ConfigError, match="needs dist.shard_size") as err:
        layout(4, strategy="hsdp")
    assert err.value.key == "dist.shard_size"
    with pytest.raises(ConfigError, match="shard_size 3 does not divide the world size 4"):
        layout(4, strategy="hsdp", shard_size=3)
    with pytest.raises(ConfigError, match="dist.strategy"):
        validate(tiny_config(dist={"strategy": "zero3"}))
