"""Sentence log-probabilities from a causal LM in a local Hugging Face directory (`--rescore DIR`).

Any directory `save_pretrained` wrote for a causal LM loads the same way (OPT, Llama,
Mistral, GPT-2 ...): `AutoTokenizer` and `AutoModelForCausalLM.from_pretrained(DIR,
local_files_only=True)`, so nothing is downloaded at run time. `transformers` is the
`rescore` extra's, imported only here and only when a rescorer is built.

A sentence is scored as the sum of its tokens' natural-log probabilities after the
tokenizer's BOS token (its EOS where it has none), the closing EOS included, so a
hypothesis that stops mid-sentence pays for it. Sentences are scored as the decoder writes
them: lower case, no punctuation. They are batched shortest first (right-padded,
attention-masked), in bf16 on an accelerator and f32 on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from b2t.errors import B2tError, InputFileError, UsageError
from b2t.progress import progress_bar

INSTALL_HINT = "pip install 'b2t[rescore]'"


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise UsageError(f"--rescore needs transformers, which the rescore extra installs: {INSTALL_HINT}") from None
    transformers.utils.logging.set_verbosity_error()  # its notices and loading bars are not b2t-eval's output
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _reason(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class CausalLMScorer:
    """A causal LM that scores sentences (natural-log probabilities, see the module docstring)."""

    def __init__(self, path: str | Path, device: str | torch.device | None = None, batch_size: int = 16) -> None:
        """path: a local directory with config.json, the weights and a tokenizer (`save_pretrained`'s
        output). A directory that holds something else is a ValueError naming it."""
        self.path = Path(path)
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        if not self.path.is_dir():
            raise InputFileError(f"{self.path}: not a directory; --rescore takes a Hugging Face model directory "
                                 "(what save_pretrained writes)")
        if not (self.path / "config.json").is_file():
            raise InputFileError(f"{self.path} has no config.json: not a Hugging Face model directory "
                                 "(what save_pretrained writes)")
        transformers = _transformers()
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
        self.batch_size = batch_size
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputFileError(f"{self.path}: no tokenizer that AutoTokenizer loads ({_reason(e)})") from None
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True,
                                                                      dtype=self.dtype)
        except ValueError as e:
            raise InputFileError(f"{self.path}: not a causal LM that AutoModelForCausalLM loads ({_reason(e)}); "
                                 "--rescore takes a decoder LM such as OPT, Llama, Mistral or GPT-2") from None
        except (OSError, KeyError, RuntimeError) as e:
            raise InputFileError(f"{self.path}: its weights do not load ({_reason(e)})") from None
        self.model = model.to(self.device).eval()
        tok = self.tokenizer
        rows = self.model.get_input_embeddings().num_embeddings
        if len(tok) < 3:  # transformers builds an empty tokenizer where the files are missing
            raise InputFileError(f"{self.path}: its tokenizer is empty ({len(tok)} tokens): are the tokenizer files "
                                 "(tokenizer.json, vocab files) missing?")
        if len(tok) > rows:
            raise InputFileError(f"{self.path}: its tokenizer has {len(tok)} tokens, the model embeds {rows}: "
                                 "not this model's tokenizer")
        self._start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if self._start is None:
            raise InputFileError(f"{self.path}: its tokenizer has neither a BOS nor an EOS token to start a sentence with")
        self._end = tok.eos_token_id
        self.context: int | None = getattr(self.model.config, "max_position_embeddings", None)  # tokens

    def token_ids(self, sentence: str) -> list[int]:
        """`sentence`'s tokens between the start token and the EOS (when the tokenizer has one)."""
        ids = list(self.tokenizer(sentence, add_special_tokens=True)["input_ids"])
        if not ids or ids[0] != self._start:
            ids.insert(0, self._start)
        if self._end is not None and (len(ids) == 1 or ids[-1] != self._end):
            ids.append(self._end)
        if self.context is not None and len(ids) > self.context:
            raise InputFileError(f"{self.path}: a hypothesis of {len(ids)} tokens ({sentence[:60]!r}...) is longer than "
                                 f"the model's context of {self.context} tokens: rescore with a model of a longer context")
        return ids

    @torch.inference_mode()
    def score(self, sentences: Sequence[str], *, progress: bool = True) -> list[float]:
        """Natural-log probability of each sentence, in the order given."""
        ids = [self.token_ids(s) for s in sentences]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = [0.0] * len(ids)
        with progress_bar(total=len(ids), desc="rescoring", unit="sentence", disable=not progress) as bar:
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                for i, value in zip(batch, self._batch_scores([ids[i] for i in batch])):
                    out[i] = value
                bar.update(len(batch))
        return out

    def _batch_scores(self, rows: list[list[int]]) -> list[float]:
        """Each row's summed log-probability of its tokens after the first."""
        width = max(map(len, rows))
        tokens = torch.full((len(rows), width), self._start, dtype=torch.long)  # (B, L); padding masked out
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, L)
        for r, row in enumerate(rows):
            tokens[r, :len(row)] = torch.tensor(row)
            mask[r, :len(row)] = 1
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        try:
            logits = self.model(input_ids=tokens, attention_mask=mask).logits[:, :-1].float()  # (B, L-1, V)
        except RuntimeError as e:  # torch.OutOfMemoryError, mostly
            raise B2tError(f"{self.path}: the model failed on {len(rows)} hypotheses of up to {width} tokens "
                           f"({_reason(e)}); a smaller --rescore-batch needs less memory") from None
        picked = logits.log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]  # (B, L-1)
        return (picked * mask[:, 1:]).sum(1).cpu().tolist()
