"""A tiny causal LM trained on a sentence corpus, saved as a Hugging Face directory for `b2t-eval --rescore`.

No machine here can download a pretrained LM, so the tests and the word benchmarks train
their own: a word-level tokenizer over the corpus's words (`tokenizers`' WordLevel, one
token per word, `<|endoftext|>` as BOS, EOS and padding) and a GPT-2 of a few layers,
trained with AdamW on whole sentences for a fixed number of steps, then written with
`save_pretrained`, so `b2t-eval --rescore DIR` loads it through AutoTokenizer and
AutoModelForCausalLM as it loads OPT or Llama. Deterministic for a seed. Needs the
`rescore` extra (transformers).

    python -m tests.tiny_causal_lm CORPUS.txt OUT_DIR --steps 300   # from the repo root
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import click
import torch

from b2t.text import words_of

END, UNK = "<|endoftext|>", "<unk>"
CONTEXT = 256
"""Positions the model embeds: longer than any hypothesis of a trial (the beam may write more words than the corpus)."""


def train_causal_lm(sentences: Sequence[str], out: Path, *, steps: int = 300, seed: int = 0, layers: int = 2,
                    width: int = 64, batch_size: int = 32, lr: float = 3e-3) -> Path:
    """Train on `sentences` (normalised to the competition's words) and save to `out` (replaced whole)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    lines = [words for s in sentences if (words := words_of(s))]
    if not lines:
        raise ValueError("the corpus has no words to train on")
    if max(map(len, lines)) + 2 > CONTEXT:
        raise ValueError(f"a corpus sentence is longer than the model's context of {CONTEXT} tokens")
    vocab = {t: i for i, t in enumerate([END, UNK, *sorted({w for line in lines for w in line})])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=END, eos_token=END, unk_token=UNK,
                                   pad_token=END)
    rows = [[vocab[END], *(vocab[w] for w in line), vocab[END]] for line in lines]
    width_tokens = max(map(len, rows))
    config = GPT2Config(vocab_size=len(vocab), n_positions=CONTEXT, n_embd=width, n_layer=layers,
                        n_head=2, bos_token_id=vocab[END], eos_token_id=vocab[END], pad_token_id=vocab[END])
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps):
        batch = rng.sample(rows, min(batch_size, len(rows)))
        tokens = torch.full((len(batch), width_tokens), vocab[END])  # (B, L)
        mask = torch.zeros((len(batch), width_tokens), dtype=torch.long)  # (B, L)
        for r, row in enumerate(batch):
            tokens[r, :len(row)] = torch.tensor(row)
            mask[r, :len(row)] = 1
        loss = model(input_ids=tokens, attention_mask=mask, labels=tokens.masked_fill(mask == 0, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    fast.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


@click.command()
@click.argument("corpus", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--steps", default=300, show_default=True, help="AdamW steps of 32 sentences.")
@click.option("--seed", default=0, show_default=True)
@click.option("--layers", default=2, show_default=True)
@click.option("--width", default=64, show_default=True, help="Embedding width.")
def main(corpus: Path, out: Path, steps: int, seed: int, layers: int, width: int) -> None:
    start = time.perf_counter()
    train_causal_lm(corpus.read_text().splitlines(), out, steps=steps, seed=seed, layers=layers, width=width)
    click.echo(f"wrote {out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
