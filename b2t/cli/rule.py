"""One rule for every b2t command line: an expected failure is one line and exit code 2; a bug says so.

Each b2t command is a `Command` (or a `Group`, whose subcommands it covers too), which catches:
- a `B2tError` (`b2t.errors`: bad input, options that do not go together, a folder another
  b2t process holds ...): `error: <its message>`, exit 2;
- an `OSError` (a path under a regular file, a full disk, a missing permission): the path,
  the reason and what to do, exit 2;
- anything else: a bug in b2t, never shown as the user's mistake: one line that names the
  exception and asks for a report, exit 70, or the traceback with `B2T_DEBUG=1`.
The same classes install the one SIGTERM/SIGINT policy (`b2t.signals`) for the whole of a
command's run.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import click

from b2t import signals
from b2t.errors import B2tError

EXIT_CODE = 2
INTERNAL_EXIT_CODE = 70  # sysexits' EX_SOFTWARE
DEBUG_ENV = "B2T_DEBUG"

_HINTS = {
    errno.ENOTDIR: "a part of that path is a regular file, not a directory: choose another path",
    errno.EEXIST: "it already exists as another kind of file: choose another path",
    errno.EISDIR: "it is a directory, where a file is expected",
    errno.ENOENT: "it does not exist",
    errno.EACCES: "permission denied: fix its permissions, or choose another path",
    errno.EPERM: "permission denied: fix its permissions, or choose another path",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.ENOSPC: "the disk is full: free space, then run the same command again",
}


class UserError(click.ClickException):
    """Bad input or an unusable path: `error: ...`, exit code 2."""

    exit_code = EXIT_CODE

    def show(self, file: Any = None) -> None:
        click.secho(f"error: {self.format_message()}", fg="red", err=True)


def internal_error_line(e: BaseException) -> str:
    """What a bug in b2t says instead of a traceback."""
    return (f"internal error: {type(e).__name__}: {e}\n(a bug in b2t, not in your input: please report it with "
            f"this command line; {DEBUG_ENV}=1 shows the traceback)")


def os_error_line(e: OSError) -> str:
    """`path: reason (what to do)` for an OSError, e.g. from mkdir under a regular file."""
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None) or "the output"
    reason = e.strerror or str(e)
    hint = _HINTS.get(e.errno or 0)
    return f"{where}: {reason}" + (f" ({hint})" if hint else "")


class _CommandLineRule:
    def invoke(self, ctx: click.Context) -> Any:
        try:
            with signals.installed(ctx.command_path):
                return super().invoke(ctx)  # type: ignore[misc]
        except signals.Stopped as e:  # stopped by a signal after keeping its work
            click.secho(e.line, fg="yellow", err=True)
            ctx.exit(e.exit_code)
        except B2tError as e:
            raise UserError(str(e)) from None
        except OSError as e:
            if e.errno == errno.EPIPE:  # click itself handles a closed stdout
                raise
            raise UserError(os_error_line(e)) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:
            if os.environ.get(DEBUG_ENV):
                raise
            click.secho(internal_error_line(e), fg="red", err=True)
            ctx.exit(INTERNAL_EXIT_CODE)


class Command(_CommandLineRule, click.Command):
    """A click command under the rule above, whose run stops on SIGTERM/SIGINT as `b2t.signals` says."""


class Group(_CommandLineRule, click.Group):
    """A click group whose subcommands run under the rule above, stopping on SIGTERM/SIGINT as
    `b2t.signals` says."""
