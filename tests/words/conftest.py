"""Fixtures of the word tests: a 3-gram ARPA LM of test_beam's toy grammar."""

from __future__ import annotations

import pytest

from b2t.words.ngram import build_arpa
from tests.words.test_beam import sentences


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("lm") / "lm.arpa"
    path.write_text(build_arpa(sentences(400, seed=0), order=3))
    return str(path)
