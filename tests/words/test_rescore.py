"""The causal-LM rescorer (b2t.words.rescore) on a tiny GPT-2 saved as a Hugging Face directory:
its sentence scores are the model's own, batched or not, and every directory it cannot use,
or a missing transformers, is one clear error."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from b2t.cli.eval import eval_main
from b2t.words.rescore import INSTALL_HINT, CausalLMScorer
from tests.words.test_beam import sentences

pytest.importorskip("transformers", reason="the rescore extra is not installed")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained (random) 2-layer GPT-2 over the toy grammar's words: scoring needs no training."""
    from tests.tiny_causal_lm import train_causal_lm

    return train_causal_lm(sentences(50, seed=0), tmp_path_factory.mktemp("clm") / "lm", steps=0)


def test_scores_are_the_models_log_probabilities_batched_or_not(lm_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    scorer = CausalLMScorer(lm_dir, device="cpu", batch_size=3)
    assert scorer.dtype == torch.float32  # f32 on a CPU
    texts = sentences(7, seed=1) + [""]
    scores = scorer.score(texts, progress=False)
    model = AutoModelForCausalLM.from_pretrained(lm_dir, local_files_only=True).eval()
    for text, score in zip(texts, scores):
        ids = scorer.token_ids(text)
        assert ids[0] == ids[-1] == scorer.tokenizer.eos_token_id and len(ids) == len(text.split()) + 2
        with torch.no_grad():  # the mean NLL of the tokens after the first, times their number
            loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
        assert score == pytest.approx(-float(loss) * (len(ids) - 1), rel=1e-5)
    one_by_one = CausalLMScorer(lm_dir, device="cpu", batch_size=1).score(texts, progress=False)
    assert one_by_one == pytest.approx(scores, rel=1e-5)
    assert scorer.context == 256
    with pytest.raises(ValueError, match=r"a hypothesis of 302 tokens .* longer than the model's context of 256"):
        scorer.score(["the " * 300], progress=False)


def test_directories_it_cannot_use_are_one_clear_error(lm_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"absent: not a directory"):
        CausalLMScorer(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty has no config\.json: not a Hugging Face model directory"):
        CausalLMScorer(tmp_path / "empty")
    encoder = tmp_path / "vit"  # a tokenizer and a config, but of an image encoder
    shutil.copytree(lm_dir, encoder)
    (encoder / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 32}))
    with pytest.raises(ValueError, match=r"vit: not a causal LM that AutoModelForCausalLM loads"):
        CausalLMScorer(encoder)
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(lm_dir, no_tokenizer)
    for f in no_tokenizer.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ValueError, match=r"no_tokenizer: its tokenizer is empty"):
        CausalLMScorer(no_tokenizer)


def test_without_transformers_rescore_says_to_install_the_extra(lm_dir: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ValueError, match="rescore extra"):
        CausalLMScorer(lm_dir)
    ckpt, data, lexicon = tmp_path / "c.safetensors", tmp_path / "data", tmp_path / "lexicon.txt"
    ckpt.write_bytes(b"")
    data.mkdir()
    lexicon.write_text("a AH\n")
    out = CliRunner().invoke(eval_main, [str(ckpt), str(data), "--split", "val", "--lexicon", str(lexicon),
                                         "--rescore", str(lm_dir)])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert out.output.strip().splitlines() == [f"error: --rescore needs transformers, which the rescore extra "
                                               f"installs: {INSTALL_HINT}"]
