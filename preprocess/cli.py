"""`b2t-preprocess`: write fixed-shape batch shards from HDF5 sessions, or verify written ones.

Thin: parsing and printing only. The work is `preprocess.writer.prepare_dataset` and
`preprocess.verify.verify`; bad config or data end in one clean message, not a traceback.
"""

from __future__ import annotations

from pathlib import Path

import click

from b2t.cli.rule import Group
from b2t.config import load_config
from b2t.data.manifest import MANIFEST_NAME, SPLITS
from b2t.paths import Place, RegularFile, refuse_clashes
from preprocess.verify import verify
from preprocess.writer import PrepareReport, prepare_dataset

DEFAULT_COMMAND = "build"


class _DefaultGroup(Group):
    """A group whose first argument, unless it names a command, starts the default command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Brain-to-Text HDF5 sessions -> WebDataset shards of fixed-shape bf16 batches.

    \b
      b2t-preprocess SRC OUT [OPTIONS]   write (or finish) the shards and OUT/manifest.json;
                                         same as `b2t-preprocess build SRC OUT ...`
      b2t-preprocess verify DIR          check every shard of DIR against its manifest

    Run `b2t-preprocess build --help` or `b2t-preprocess verify --help` for the options.
    """


def _splits(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = sorted(set(chosen) - set(SPLITS))
    if unknown or not chosen:
        raise click.BadParameter(f"{value!r}: give a comma-separated subset of {','.join(SPLITS)}")
    return chosen


@main.command(DEFAULT_COMMAND)
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--config", "config_path", type=RegularFile(),
              help="YAML config (its data and model sections are used; default: built-in defaults).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override one config value, e.g. --set data.n_buckets=3 (repeatable).")
@click.option("--epochs", type=click.IntRange(1), help="Shuffled train compositions to write (sets data.epochs).")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Worker processes (each opens the HDF5 files itself).")
@click.option("--skip-bad", is_flag=True, help="Exclude bad trials (listed in the manifest) instead of failing.")
@click.option("--splits", default=",".join(SPLITS), show_default=True, callback=_splits,
              help="Comma-separated splits to write.")
@click.option("--overwrite", is_flag=True, help="Replace a dataset in OUT made with another config or inputs.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show progress bars.")
def build(src: Path, out: Path, config_path: Path | None, overrides: tuple[str, ...], epochs: int | None,
          workers: int, skip_bad: bool, splits: tuple[str, ...], overwrite: bool, progress: bool) -> None:
    """Write the shards of SRC (a folder of t15.* session folders) into OUT.

    Every trial is validated first; bucket lengths, batch rows and train compositions
    follow the config. A re-run with the same inputs and config only finishes what is
    missing; OUT/manifest.json is written last.
    """
    refuse_clashes([Place("OUT", out, tree=True)], [Place("SRC", src, tree=True)])
    config = load_config(config_path, list(overrides) + ([f"data.epochs={epochs}"] if epochs else []))
    report = prepare_dataset(src, out, config, splits=splits, skip_bad=skip_bad, workers=workers,
                             overwrite=overwrite, progress=progress)
    for warning in report.manifest.warnings:
        click.secho(f"warning: {warning} (recorded in {out / MANIFEST_NAME})", fg="yellow", err=True)
    click.echo(summary(report))


@main.command("verify")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--decode/--no-decode", default=True, show_default=True,
              help="Also decode every batch and check it against the contract (slower).")
def verify_command(directory: Path, decode: bool) -> None:
    """Check every shard in DIR against DIR/manifest.json: present, size, sha256 and (by
    default) every batch's shapes, dtypes and padding. Exits 1 naming each bad shard."""
    report = verify(directory, decode=decode)
    click.echo(report.summary())
    if not report.ok:
        raise SystemExit(1)


def summary(report: PrepareReport) -> str:
    """The closing lines: buckets, padding per split, shards and bytes, exclusions, throughput."""
    m = report.manifest
    lines = ["buckets (T x B, L labels): " + ", ".join(f"{b.T}x{b.B} L={b.L}" for b in m.buckets)]
    for split, s in m.splits.items():
        epochs = f", {s['epochs']} epochs" if split == "train" else ""
        lines.append(
            f"{split}: {s['n_trials']} trials in {s['n_batches']} batches{epochs}; padding "
            f"{100 * s['padding_fraction']:.1f}% of bins in trials, {100 * s['slot_padding_fraction']:.1f}% "
            f"of all bins with {s['padding_rows']} padding rows"
        )
    total = sum(s.bytes for s in m.shards)
    lines.append(f"shards: {len(m.shards)} ({report.written} written, {report.reused} verified and kept), "
                 f"{total / 1e6:.1f} MB")
    lines.append(f"exclusions: {len(m.exclusions)}" +
                 (f" (listed in {report.out / MANIFEST_NAME})" if m.exclusions else ""))
    wrote = "nothing left to write"
    if report.unchanged:
        lines.append(f"time: {len(m.sources)} source files and {len(m.shards)} shards unchanged since {MANIFEST_NAME} "
                     f"(sha256 checked in {report.scan_seconds:.1f} s): nothing to scan, {wrote}")
        return "\n".join(lines)
    if report.written_trials:
        rate = report.written_trials / max(report.write_seconds, 1e-9)
        wrote = f"wrote {report.written_trials} trials in {report.write_seconds:.1f} s ({rate:.0f} trials/s)"
    lines.append(f"time: scanned and checked {report.scanned_trials} trials in {report.scan_seconds:.1f} s; {wrote}")
    return "\n".join(lines)
