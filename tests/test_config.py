"""The config schema: the shipped YAML files load, unknown keys fail with a hint, overrides parse."""


import re

import pytest
import yaml

from b2t.config import CONFIG_DIR, Config, ConfigError, load_config

CONFIGS = CONFIG_DIR


@pytest.mark.parametrize("name", ["baseline.yaml", "tiny.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / name)
    assert isinstance(cfg, Config)


def test_baseline_is_the_reference_recipe():
    cfg = load_config(CONFIGS / "baseline.yaml")
    assert (cfg.model.gru.n_units, cfg.model.gru.n_layers, cfg.model.patch_size, cfg.model.patch_stride) == (768, 5, 14, 4)
    assert (cfg.data.batch_size, cfg.data.days_per_batch) == (64, 4)
    assert (cfg.optim.lr, cfg.optim.lr_min, cfg.optim.eps, cfg.optim.weight_decay) == (0.005, 0.0001, 0.1, 0.001)
    assert (cfg.optim.warmup_steps, cfg.optim.decay_steps, cfg.optim.grad_clip) == (1000, 120_000, 10.0)
    assert (cfg.train.steps, cfg.train.val_every) == (120_000, 2000)
    assert cfg.to_dict() == load_config(None).to_dict(), "baseline.yaml's values are the defaults"


def _keys(d: dict, prefix: str = "") -> set[str]:
    return set().union(*(_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k} for k, v in d.items()))


def test_baseline_spells_out_every_key_of_its_family():
    """Every key the gru family reads is written in baseline.yaml (docs/configuration.md says
    so): the other family's section alone is left to its defaults."""
    written = _keys(yaml.safe_load((CONFIGS / "baseline.yaml").read_text()))
    schema = {k for k in _keys(Config().to_dict()) if not k.startswith("model.noise_separating.")}
    assert written == schema


def test_unknown_key_suggests_the_nearest(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key in section 'train' 'stpes'; did you mean 'steps'"):
        load_config(p)


def test_unknown_section(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optimizer:\n  lr: 1\n")
    with pytest.raises(ConfigError, match=r"unknown config section 'optimizer'; did you mean 'optim'"):
        load_config(p)


def test_overrides_are_yaml_scalars():
    cfg = load_config(CONFIGS / "tiny.yaml", ["train.steps=7", "data.token_budget=null", "optim.lr=0.5"])
    assert cfg.train.steps == 7 and cfg.data.token_budget is None and cfg.optim.lr == 0.5


@pytest.mark.parametrize("override, message", [
    ("train.backend=tpu", "choose one of openxla, xla, inductor, eager"),
    ("data.batch_size=10", "multiple of data.row_multiple"),
    ("model.patch_stride=20", "patch_stride=20 must be in 1..patch_size"),
    ("steps=3", "section.key=value"),
    ("optim.beta1=2", r"optim.beta1=2.0 must be in \[0, 1\) \(AdamW\)"),  # these were AdamW's tracebacks (rc 70)
    ("optim.beta2=1.5", r"optim.beta2=1.5 must be in \[0, 1\)"),
    ("optim.eps=-1", r"optim.eps=-1.0 must be >= 0"),
    ("optim.weight_decay=-0.1", r"optim.weight_decay=-0.1 must be >= 0"),  # these trained, silently wrong
    ("optim.grad_clip=-5", r"optim.grad_clip=-5.0 must be >= 0"),
    ("optim.lr_min=-1", r"optim.lr_min=-1.0 and optim.lr_day_min=0.0005 must be in 0..their peak"),
    ("optim.lr_day_min=1", r"must be in 0..their peak \(lr=0.01, lr_day=0.01\)"),
    ("model.gru.n_units=1000000000000", r"n_units and n_layers must be in 1..65536 and 1..64"),  # the allocator's
    ("model.patch_size=1000000", r"patch_size at most 1024 bins"),  # exit 70 in b2t-eval and the importer
])
def test_invalid_values_say_how_to_fix(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIGS / "tiny.yaml", [override])


@pytest.mark.parametrize("override, message", [
    ("train.steps=2.5", r"train\.steps=2\.5 \(float\): expected an integer"),
    ("train.steps=abc", r"train\.steps='abc' \(str\): expected an integer"),
    ("train.steps=true", r"train\.steps=True \(bool\): expected an integer"),
    ("optim.lr=fast", r"optim\.lr='fast' \(str\): expected a number"),
    ("optim.lr=true", r"optim\.lr=True \(bool\): expected a number"),
    ("data.token_budget=1.5", r"data\.token_budget=1\.5 \(float\): expected an integer or null"),
    ("train.backend=3", r"train\.backend=3 \(int\): expected a string"),
    ("model.gru.n_units=2.5", r"model\.gru\.n_units=2\.5 \(float\): expected an integer"),
])
def test_values_are_checked_against_the_declared_types(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIGS / "tiny.yaml", [override])


def test_a_mapping_override_merges_into_its_section():
    """`--set model.gru={n_units: 32}` dropped the section's other keys (tiny's n_layers 2 and dropout)."""
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.gru={n_units: 32}"])
    assert (cfg.model.gru.n_units, cfg.model.gru.n_layers, cfg.model.gru.rnn_dropout) == (32, 2, 0.1)
    assert load_config(CONFIGS / "tiny.yaml", ["model.gru.n_units=32"]) == cfg


def test_a_key_that_is_a_number_is_an_unknown_key(tmp_path):
    """YAML reads `1:` as an integer key: the suggestion's difflib failed on it (a traceback, rc 70)."""
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  1: 2\n")
    with pytest.raises(ConfigError, match=r"unknown key in section 'train' 1; known: backend, "):
        load_config(p)


def test_ints_are_numbers_and_null_fits_optional_fields():
    cfg = load_config(CONFIGS / "tiny.yaml", ["optim.lr=1", "data.token_budget=null", "data.token_budget=512"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.data.token_budget == 512


def test_type_errors_from_a_yaml_file_name_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  log_every: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: train\.log_every=\[1, 2\] \(list\): expected an integer"):
        load_config(p)


def test_a_bad_override_is_blamed_on_the_override_not_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^--set train\.stepz=5: unknown key in section 'train' 'stepz'; "
                                          r"did you mean 'steps'"):
        load_config(CONFIGS / "tiny.yaml", ["train.steps=7", "train.stepz=5"])
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(p))}: unknown key"):
        load_config(p, ["train.steps=7"])
    assert load_config(CONFIGS / "tiny.yaml", ["data.row_multiple=2", "data.batch_size=10"]).data.batch_size == 10
    with pytest.raises(ConfigError, match=r"^--set data\.row_multiple=8 --set data\.batch_size=12 \(together\): "):
        load_config(CONFIGS / "tiny.yaml", ["data.row_multiple=8", "data.batch_size=12"])  # each alone is valid
@pytest.mark.parametrize("override, message", [
    ("data.seed=-1", r"data.seed must be >= 0, got -1"),  # issue 35 case 19: numpy's traceback in b2t-preprocess
    ("train.seed=1180591620717411303424", r"train.seed=1180591620717411303424: out of range"),  # 2**70: "Overflow"
    ("train.steps=-99999999999999999999", r"train.steps=-99999999999999999999: out of range"),
    ("optim.lr=1e400", r"optim.lr=inf: expected a finite number"),
    ("augment.smooth_std=.nan", r"augment.smooth_std=nan: expected a finite number"),
])
def test_seeds_and_numbers_out_of_range_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIGS / "tiny.yaml", [override])
