"""A config's `base:` file: sections merge key by key under the config, found relative to it;
cycles and missing bases are one-line errors; the shipped configs state only what differs."""

from __future__ import annotations

import pytest

from b2t.buckets import batch_rows
from b2t.config import CONFIG_DIR, ConfigError, load_config
from b2t.plan.memory import COMPETITION_BUCKETS


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_config_overrides_its_base_key_by_key(tmp_path):
    write(tmp_path / "base.yaml", "train:\n  steps: 10\n  log_every: 5\noptim:\n  lr: 0.5\n")
    child = write(tmp_path / "child.yaml", "base: base.yaml\ntrain:\n  steps: 20\n")
    cfg = load_config(child)
    assert (cfg.train.steps, cfg.train.log_every, cfg.optim.lr) == (20, 5, 0.5)
    assert load_config(child, ["train.log_every=7"]).train.log_every == 7, "--set applies on top of both"


def test_nested_sections_merge_and_bases_chain_relative_to_each_file(tmp_path):
    write(tmp_path / "root.yaml", "model:\n  family: noise_separating\n  noise_separating:\n"
          "    noise: {n_units: 8, n_layers: 1}\n    reversal_scale: 2.0\n")
    write(tmp_path / "mid" / "mid.yaml", "base: ../root.yaml\nmodel:\n  noise_separating:\n    noise: {n_layers: 3}\n")
    leaf = write(tmp_path / "leaf" / "leaf.yaml", "base: ../mid/mid.yaml\nmodel:\n  noise_separating:\n"
                 "    reversal_scale: 3.0\n")
    ns = load_config(leaf).model.noise_separating
    assert (ns.noise.n_units, ns.noise.n_layers, ns.reversal_scale) == (8, 3, 3.0)
    assert load_config(leaf).model.family == "noise_separating"


@pytest.mark.parametrize("files", [{"a.yaml": "base: a.yaml\n"},
                                   {"a.yaml": "base: b.yaml\n", "b.yaml": "base: sub/../a.yaml\n"}],
                         ids=["self", "two files"])
def test_a_base_cycle_is_refused_naming_the_files(tmp_path, files):
    for name, text in files.items():
        write(tmp_path / name, text + "train:\n  steps: 3\n")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError, match=r"\.yaml: base: .* makes a cycle \(.*a\.yaml -> .*a\.yaml\)"):
        load_config(tmp_path / "a.yaml")


def test_a_missing_or_malformed_base_says_where_it_was_looked_for(tmp_path):
    child = write(tmp_path / "child.yaml", "base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"child\.yaml: base: nowhere\.yaml: .*nowhere\.yaml is not a file "
                                          r"\(the base is found relative to .*\)"):
        load_config(child)
    write(child, "base: [baseline.yaml]\n")
    with pytest.raises(ConfigError, match=r"child\.yaml: base=\['baseline\.yaml'\]: expected a file name"):
        load_config(child)
    write(tmp_path / "empty.yaml", "")
    write(child, "base: empty.yaml\n")
    with pytest.raises(ConfigError, match=r"empty\.yaml: the file is empty"):
        load_config(child)


def test_noise687m_states_only_what_differs_from_the_baseline():
    text = (CONFIG_DIR / "noise687m.yaml").read_text()
    assert text.count("\n") <= 25 and "base: baseline.yaml" in text
    big, base = load_config(CONFIG_DIR / "noise687m.yaml"), load_config(CONFIG_DIR / "baseline.yaml")
    assert (big.optim, big.augment) == (base.optim, base.augment)
    assert big.train == base.train  # openxla, the card's backend, as the TPU check compiles it (docs/tpu.md)
    assert big.model.family == "noise_separating" and big.model.patch_size == base.model.patch_size


def test_noise687m_batches_split_over_its_mesh_with_and_without_its_token_budget_hint():
    cfg = load_config(CONFIG_DIR / "noise687m.yaml")
    devices = cfg.mesh.data * cfg.mesh.fsdp
    assert (cfg.mesh.data, cfg.mesh.fsdp) == (8, 1) and cfg.data.row_multiple % devices == 0
    assert "token_budget: 65536" in (CONFIG_DIR / "noise687m.yaml").read_text()
    for budget in (cfg.data.token_budget, 65536):
        rows = [batch_rows(b.T, cfg.data.batch_size, budget, cfg.data.row_multiple) for b in COMPETITION_BUCKETS]
        assert all(r % devices == 0 for r in rows), (budget, rows)
