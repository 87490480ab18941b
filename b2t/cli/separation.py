"""`b2t-separation CKPT DATA`: how well a noise-separating checkpoint separates, on b2t-synth data
written with --ground-truth.

One row per session and one pooled: R^2 of the noise estimate against the true non-speech part
(with the estimate's energy relative to that part and its cosine with it), the share of the
speech part it takes with it (and the share the true non-speech part itself would take, the
reference), both heads' greedy PER (definitions in `b2t.separation`).
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from b2t.cli.rule import Command
from b2t.paths import RegularFile


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", type=RegularFile())
@click.argument("data", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--split", type=click.Choice(["train", "val"]), default="val", show_default=True,
              help="A labelled split (test trials have no reference phonemes).")
def separation_main(checkpoint: Path, data: Path, split: str) -> None:
    """Separation report of CHECKPOINT (a noise_separating model) on DATA (a b2t-synth folder
    written with --ground-truth, which holds ground_truth.hdf5), as a markdown table."""
    from b2t.separation import load_model, separation_report

    report = separation_report(load_model(checkpoint), data, split)
    click.echo(f"{checkpoint} on {data} ({split})\n")
    click.echo("| session | trials | R^2 of estimate | its energy | cosine | speech leakage | (of the true part) "
               "| clean head PER | noisy head PER |")
    click.echo("|---|---|---|---|---|---|---|---|---|")
    for session, r in report.items():
        click.echo(f"| {session} | {r.trials} | {r.r2:.3f} | {r.energy:.3f} | {r.cosine:.3f} | {r.leakage:.3f} | "
                   f"{r.truth_leakage:.3f} | {r.clean_per:.3f} | {r.noisy_per:.3f} |")
    if math.isnan(report["all"].r2):
        click.echo(f"\nnote: {data}'s non-speech part is zero in every trial, so R^2, its energy and the cosine "
                   "(measured against it) are undefined (nan): write the data with b2t-synth --structured-noise-rank K "
                   "or --preset realistic to measure them", err=True)
