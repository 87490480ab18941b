"""KenLM binary models: our ARPA text (`b2t.words.ngram`) converted by KenLM's own build_binary.

KenLM maps a binary model instead of parsing text, so the decoder loads it at once (and
without the "build a binary file" hint). We write no part of that format: `make install`
compiles KenLM's build_binary into the virtual environment (tools/build_kenlm_binary.sh),
and this module runs it and publishes its output atomically.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from b2t.atomic import atomic_path
from b2t.errors import B2tError

BINARY_SUFFIXES = (".bin", ".klm")
"""Output names that `b2t-lm build` writes as a KenLM binary (others get ARPA text)."""
BUILD_BINARY = "build_binary"


class BuildBinaryError(B2tError):
    """KenLM's build_binary is not installed, or it refused the model."""


def kenlm_reason(message: str) -> str:
    """The human part of a KenLM error: the line after the one naming the C++ source line that
    threw (`lm/x.cc:65 in ... threw FormatLoadException.`), else the last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for where, reason in zip(lines, lines[1:]):
        if " threw " in where:
            return reason
    return lines[-1] if lines else "no reason given"


def find_build_binary() -> Path | None:
    """The build_binary beside this Python (where `make install` puts it), else one on PATH."""
    beside = Path(sys.executable).parent / BUILD_BINARY
    if beside.is_file():
        return beside
    found = shutil.which(BUILD_BINARY)
    return None if found is None else Path(found)


def write_binary_lm(arpa: str, path: Path) -> Path:
    """Write the ARPA model `arpa` to `path` as a KenLM binary, whole or not at all.

    The probing structure: KenLM's fastest, and its stored log10 scores are the ARPA's
    float values, so the decoder scores exactly as it does on the text (no quantisation).
    """
    program = find_build_binary()
    if program is None:
        raise BuildBinaryError(f"cannot write {path}: KenLM's {BUILD_BINARY} is not installed (`make install` "
                               f"builds it); write ARPA text instead (-o {path.with_suffix('.arpa')})")
    with tempfile.TemporaryDirectory() as scratch, atomic_path(path) as tmp:
        text = Path(scratch) / "lm.arpa"
        text.write_text(arpa, encoding="utf-8")
        result = subprocess.run([str(program), "probing", str(text), str(tmp)], capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildBinaryError(f"{program} failed to write {path} (exit status {result.returncode}): "
                                   f"{kenlm_reason(result.stderr)}")
    return path
