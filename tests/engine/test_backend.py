"""Backends (b2t.engine.backend): what differs between devices, and the compile counters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from b2t.config import BACKENDS
from b2t.engine import backend as backend_module
from b2t.engine.backend import BACKEND_CLASSES, CompileStats, backend_class, describe, make_backend

REPO = Path(__file__).resolve().parents[2]


def test_stats_since_counts_only_what_grew():
    early = CompileStats(3, {"aten::a": 1, "aten::b": 2})
    late = CompileStats(7, {"aten::a": 1, "aten::b": 5, "aten::c": 1})
    assert late.since(early) == CompileStats(4, {"aten::b": 3, "aten::c": 1})
    assert late.since(early).to_dict() == {"compilations": 4, "fallbacks": {"aten::b": 3, "aten::c": 1}}


def test_unknown_backend_and_a_mesh_off_xla_are_refused():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        make_backend("tpu")
    with pytest.raises(ValueError, match="an SPMD mesh needs an XLA backend"):
        make_backend("eager", "cpu", mesh=object())


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_places_batches_on_its_device_and_autocasts_to_bf16(name):
    backend = make_backend(name, None if backend_class(name).xla else "cpu")
    assert backend.name == name and backend.xla == (backend.device.type == "xla")
    placed = backend.place({"x": torch.ones(2, 3, dtype=torch.float32, device="cpu")})
    assert placed["x"].device.type == backend.device.type
    with backend.autocast():
        y = placed["x"] @ placed["x"].T
    assert y.dtype == torch.bfloat16


def test_xla_backend_counts_its_own_compilations_from_creation():
    backend = make_backend("xla")
    x = torch.arange(91, dtype=torch.float32, device="cpu").reshape(13, 7).to(backend.device)  # a shape no other test uses
    (x * 3 + 1).sum(0).cpu()
    stats = backend.stats()
    assert stats.compilations >= 1 and stats.fallbacks == {}
    assert make_backend("xla").stats() == CompileStats(0, {})
    assert make_backend("eager", "cpu").stats() == CompileStats(0, {})


def test_describe_names_the_device_it_found():
    assert describe(make_backend("eager", "cpu")) == "device: cpu (the host CPU, no XLA); backend eager"
    line = describe(make_backend("xla"))
    assert line.startswith("device: xla:0 = CPU (cpu), ") and "PJRT_DEVICE=CPU; backend xla" in line


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_compute_is_f32_only_on_a_cpu_without_bf16_matmuls_and_the_run_says_so(monkeypatch, has_bf16):
    monkeypatch.setattr(backend_module, "cpu_has_bf16_matmuls", lambda: has_bf16)
    cpu, xla = make_backend("eager", "cpu"), make_backend("xla")
    assert cpu.compute_dtype("auto") == (torch.bfloat16 if has_bf16 else torch.float32)
    assert xla.compute_dtype("auto") == torch.bfloat16, "XLA computes bf16 itself"
    assert (cpu.compute_dtype("bf16"), cpu.compute_dtype("f32")) == (torch.bfloat16, torch.float32)
    said = describe(cpu, "auto")
    assert said.endswith("; computing in f32 (this CPU has no bf16 matmuls)") != has_bf16
    assert describe(cpu, "f32").endswith("backend eager; computing in f32")
    assert describe(xla, "auto").endswith("backend xla")


def test_the_backend_classes_are_the_configs_names():
    """The config lists the names (it is the schema); the classes own everything else about them."""
    assert set(BACKEND_CLASSES) == set(BACKENDS)
    assert sorted(n for n, c in BACKEND_CLASSES.items() if c.xla) == ["openxla", "xla"]


def test_no_module_outside_the_backend_classes_compares_a_backend_name():
    names = "|".join(BACKENDS)
    compares = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = [f"{p}:{n}: {line.strip()}" for p in sorted(REPO.glob("b2t/**/*.py")) if p.name != "backend.py"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if compares.search(line) and not re.search(r"\.type\s*(==|!=)", line)]  # a device's type, not a backend
    assert not found, found
