"""The one base of every failure a b2t command expects: `B2tError`.

Bad input, an unusable path, device or dataset, options that do not go together, a run
directory in the wrong state: the user's to fix, so each is said in one line (what, where,
what to do). Every class of such failure derives from `B2tError`, and the command-line rule
(`b2t.cli.rule`) turns exactly these, and OS errors, into `error: ...` with exit code 2.
Anything else that reaches it is a bug in b2t, said as one: a line that asks for a report, or
the traceback with `B2T_DEBUG=1`.

The subclasses live beside what they guard (`ConfigError` in b2t.config, `DatasetError` in
b2t.data.manifest, ...); some also derive from the builtin they replaced (ValueError,
FileNotFoundError), so code that catches those keeps working.
"""

from __future__ import annotations


class B2tError(Exception):
    """An expected failure the user can act on; its message is the whole line to show."""


class UsageError(B2tError, ValueError):
    """Options or arguments that do not go together, or a value no command accepts."""


class MissingInput(B2tError, FileNotFoundError):
    """A file or folder the command reads does not exist; the message names it and what makes it."""


class DatasetError(B2tError, ValueError):
    """A dataset (b2t-preprocess's output) that cannot be read as written: its manifest, a shard,
    a sample; the message names the file and says how to mend it."""


class InputFileError(B2tError, ValueError):
    """A file or folder given on the command line that is not what its option takes (a weights
    file, an LM, a corpus, a model directory); the message names it and what was expected."""
