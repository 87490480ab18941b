"""`b2t-import-baseline`: the public baseline's checkpoint as a b2t checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from b2t.cli.options import config_option, set_option
from b2t.cli.rule import Command
from b2t.config import load_config
from b2t.data.manifest import MANIFEST_NAME
from b2t.paths import Place, RegularFile, refuse_clashes


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=RegularFile(dir_okay=True))
@click.option("-o", "--output", type=click.Path(dir_okay=False, readable=False, path_type=Path), required=True,
              help="The b2t checkpoint (.safetensors) to write.")
@click.option("--sessions-from", "sessions_path", type=RegularFile(dir_okay=True), default=None,
              help="A b2t-preprocess output (or an args.yaml) whose session list numbers the output's day layers "
                   "[default: the baseline's own list from its args.yaml].")
@click.option("--args", "args_path", type=RegularFile(), default=None,
              help="The baseline's args.yaml [default: the one beside the checkpoint]: model sizes and sessions.")
@config_option
@set_option
def import_main(path: Path, output: Path, sessions_path: Path | None, args_path: Path | None,
                config_path: Path | None, overrides: tuple[str, ...]) -> None:
    """Convert the public baseline checkpoint at PATH (the file, or its release directory) to b2t's format.

    The file is a torch pickle: it is loaded with torch.load(weights_only=True), which only
    rebuilds tensors and plain data and refuses any other object. Model sizes and the recipe
    come from args.yaml beside it (else from --config); each day layer is placed at its
    session's day index in the --sessions-from list.
    """
    from b2t.import_baseline import ARGS_NAME, find_checkpoint, import_baseline

    source = find_checkpoint(path)
    sessions = Path(sessions_path) / MANIFEST_NAME if sessions_path and Path(sessions_path).is_dir() else sessions_path
    refuse_clashes([Place("-o", output, kind="a checkpoint")],
                   [Place("PATH", source), Place("--args", args_path or source.parent / ARGS_NAME),
                    *([Place("--sessions-from", sessions)] if sessions else [])])
    base = load_config(config_path, overrides)
    report = import_baseline(path, output, sessions_path=sessions_path, args_path=args_path, base=base)
    per = "not stored" if report.val_per is None else f"{report.val_per:.4f}"
    click.echo(f"loaded {path} with torch.load(weights_only=True); model sizes from {report.config_source}")
    click.echo(f"wrote {report.output}: {report.n_days} day layers (of the baseline's {report.baseline_days}); "
               f"the baseline's own val PER: {per}")
