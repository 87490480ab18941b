"""One rule for every b2t command line: an OS error ends in one line and exit code 2.

A path under a regular file, a full disk or a missing permission is the user's to fix,
not a bug, so no command shows a traceback for it: each b2t command is a `Command` (or a
`Group`, whose subcommands it covers too), which turns an `OSError` into the path, the
reason and what to do; so is a folder another b2t process holds (`b2t.run_lock`). The
same classes install the one SIGTERM/SIGINT policy (`b2t.signals`) for the whole of a
command's run.
"""

from __future__ import annotations

import errno
from typing import Any

import click

from b2t import signals
from b2t.run_lock import LockedError

EXIT_CODE = 2

_HINTS = {
    errno.ENOTDIR: "a part of that path is a regular file, not a directory: choose another path",
    errno.EEXIST: "it already exists as another kind of file: choose another path",
    errno.EISDIR: "it is a directory, where a file is expected",
    errno.ENOENT: "it does not exist",
    errno.EACCES: "permission denied: choose a path you can write, or fix its permissions",
    errno.EPERM: "permission denied: choose a path you can write, or fix its permissions",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.ENOSPC: "the disk is full: free space, then run the same command again",
}


class UserError(click.ClickException):
    """Bad input or an unusable path: one line, exit code 2."""

    exit_code = EXIT_CODE


def os_error_line(e: OSError) -> str:
    """`path: reason (what to do)` for an OSError, e.g. from mkdir under a regular file."""
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None) or "a file"
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
        except LockedError as e:  # another b2t process writes (or reads) the folder
            raise UserError(str(e)) from None
        except OSError as e:
            if e.errno == errno.EPIPE:  # click itself handles a closed stdout
                raise
            raise UserError(os_error_line(e)) from None


class Command(_CommandLineRule, click.Command):
    """A click command whose OS errors end as one line and exit code 2, and whose run stops on
    SIGTERM/SIGINT as `b2t.signals` says."""


class Group(_CommandLineRule, click.Group):
    """A click group whose (and whose subcommands') OS errors end as one line and exit code 2,
    and whose runs stop on SIGTERM/SIGINT as `b2t.signals` says."""
