"""What `b2t-eval` shows and writes: the PER/WER tables, sample sentences beside their
references, and the files of `--out DIR` and `--csv FILE`.

`--out DIR` holds `trials.jsonl` (one JSON line per trial in the competition's id order:
id, session, block, trial, group, decoded_phonemes, reference_phonemes, phoneme_edits,
loss, decoded_words, reference_words, word_edits, and with the word beam `nbest`, each
hypothesis with its scores; a field that does not apply, such as a test trial's
references, is null), `decoded.txt` (every trial as a person reads it: what was decoded
over what was said) and `summary.json` (PER and WER per session and aggregate,
compilations, settings). Every file is written whole or not at all.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from b2t.atomic import atomic_write_text
from b2t.decoding import EvalSummary, TrialResult
from b2t.paths import DECODED_NAME, SUMMARY_NAME, TRIALS_NAME
from b2t.phonemes import phoneme_string
from b2t.text import words_of

N_SAMPLES = 3
"""Trials printed beside their references: the worst, the median and the best."""


def errors(r: TrialResult) -> tuple[int, int] | None:
    """(edits, reference length) of the trial's words, else of its phonemes; None without a reference."""
    if r.decoded_words is not None and r.reference_words is not None:
        return r.word_edits or 0, len(words_of(r.reference_words))
    if r.reference_phonemes is not None:
        return r.phoneme_edits or 0, len(r.reference_phonemes)
    return None


def trial_block(index: int, r: TrialResult) -> str:
    """One trial for a person: a heading with its error count, the decode, the reference."""
    words = r.decoded_words is not None
    decoded = r.decoded_words if words else phoneme_string(r.decoded_phonemes)
    reference = r.reference_words if words else (
        None if r.reference_phonemes is None else phoneme_string(r.reference_phonemes))
    score = errors(r)
    unit = "words" if words else "phonemes"
    rate = "" if score is None else f"  {unit} wrong {score[0]}/{score[1]}"
    lines = [f"#{index} {r.session} block {r.block} trial {r.trial} ({r.group}){rate}",
             f"  decoded:   {decoded}"]
    if reference is not None:
        lines.append(f"  reference: {reference}")
    return "\n".join(lines)


def samples(results: Sequence[TrialResult]) -> list[tuple[str, int]]:
    """(label, index) of the trials to print: worst, median and best by error rate (words where
    decoded, else phonemes), or the first few where the split has no references."""
    scored = []
    for i, r in enumerate(results):
        score = errors(r)
        if score is not None:
            scored.append((score[0] / max(score[1], 1), i))
    if not scored:
        return [("", i) for i in range(min(N_SAMPLES, len(results)))]
    ranked = [i for _, i in sorted(scored, key=lambda s: (-s[0], s[1]))]  # worst first; ties by id
    picks: list[tuple[str, int]] = []
    for label, i in (("worst", ranked[0]), ("median", ranked[len(ranked) // 2]), ("best", ranked[-1])):
        if all(i != j for _, j in picks):
            picks.append((label, i))
    return picks


def print_samples(results: Sequence[TrialResult]) -> None:
    picks = samples(results)
    if not picks:
        return
    labelled = any(label for label, _ in picks)
    click.echo("sentences (worst, median, best):" if labelled else "sentences (no references in this split):")
    for label, i in picks:
        block = trial_block(i, results[i])
        click.echo(f"{label}: {block}" if label else block)


def merge_compilations(per_model: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The compilations of every model's run (`CompileCount.to_dict`s) added up, and each one's."""
    return {"warm_up": sum(c["warm_up"] for c in per_model), "during_split": sum(c["during_split"] for c in per_model),
            "total": sum(c["total"] for c in per_model),
            "fallbacks": {k: v for c in per_model for k, v in c["fallbacks"].items()},
            "per_model": list(per_model)}


def print_summary(summary: EvalSummary, split: str, compilations: dict[str, Any], xla: bool, n_buckets: int) -> None:
    """The PER (and WER) tables, and on XLA the compilations of the warm-up(s) and the split."""
    if summary.loss is None:
        click.echo(f"{split}: {summary.n_trials} trials without reference phonemes (no PER)")
    else:
        click.echo(f"PER on {split} ({summary.n_trials} trials, mean CTC loss {summary.loss:.3f}):")
        click.echo(summary.per.table("PER"))
    if summary.wer is not None:
        click.echo(f"WER on {split}:")
        click.echo(summary.wer.table("WER"))
    if xla:
        per_model = compilations["per_model"]
        warm = ", ".join(str(c["warm_up"]) for c in per_model) + (" (per model)" if len(per_model) > 1 else "")
        fallbacks = compilations["fallbacks"]
        click.echo(f"XLA compilations: {warm} warming {n_buckets} buckets, {compilations['during_split']} during "
                   f"the split; host fallbacks: {json.dumps(fallbacks) if fallbacks else 'none'}")


def write_outputs(out: Path, results: Sequence[TrialResult], report: dict[str, Any], title: str) -> None:
    """`trials.jsonl`, `decoded.txt` (headed by `title`) and `summary.json` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"id": i, **r.to_dict()}) + "\n" for i, r in enumerate(results))
    atomic_write_text(out / TRIALS_NAME, "".join(lines))
    atomic_write_text(out / DECODED_NAME, f"# {title}\n\n" + "".join(trial_block(i, r) + "\n\n"
                                                                      for i, r in enumerate(results)))
    atomic_write_text(out / SUMMARY_NAME, json.dumps(report, indent=1) + "\n")


def write_csv(path: Path, rows: Sequence[tuple[int, str]]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["id", "text"])
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())
