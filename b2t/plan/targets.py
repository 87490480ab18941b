"""The TPU slices `b2t-plan --target` can compile for, by their Cloud TPU names.

A target is a topology libtpu can describe without the hardware (compile-only devices),
plus the public per-chip figures the roofline needs. The compiler itself knows each
chip's HBM (its out-of-memory message states it); `hbm` here is the marketed size, used
only where the compiler says nothing (the fit bar of a graph that compiled).

Names follow Cloud TPU: v5e-N / v6e-N count chips; v5p-N and v4-N count TensorCores,
two per chip (v5p-8 and v4-8 are 4 chips, each one device under megacore).
"""

from __future__ import annotations

from dataclasses import dataclass

from b2t.errors import UsageError

GiB = 1024**3


@dataclass(frozen=True)
class Chip:
    kind: str
    hbm: int  # bytes per chip
    peak_bf16: float  # FLOP/s per chip, dense bf16 matmul
    hbm_bandwidth: float  # bytes/s per chip


V5E = Chip("v5e", 16 * GiB, 197e12, 819e9)
V6E = Chip("v6e", 32 * GiB, 918e12, 1640e9)
V5P = Chip("v5p", 95 * GiB, 459e12, 2765e9)
V4 = Chip("v4", 32 * GiB, 275e12, 1228e9)


@dataclass(frozen=True)
class Target:
    """One TPU slice: `chips` devices in `topology` (libtpu's name), `host_chips` per host."""

    name: str
    chip: Chip
    topology: str
    host_bounds: tuple[int, int, int]
    chips: int
    chip_config: str = "default"  # libtpu's; "megacore" makes a v4 chip's two cores one device

    @property
    def hosts(self) -> int:
        x, y, z = self.host_bounds
        return self.chips // (x * y * z)


def _slice(chip: Chip, chips: int, topology: str, host_bounds: tuple[int, int, int], name: str = "",
           chip_config: str = "default") -> Target:
    return Target(name or f"{chip.kind}-{chips}", chip, f"{chip.kind}:{topology}", host_bounds, chips, chip_config)


TARGETS: dict[str, Target] = {t.name: t for t in (
    _slice(V5E, 1, "1x1", (1, 1, 1)),
    _slice(V5E, 4, "2x2", (2, 2, 1)),
    _slice(V5E, 8, "2x4", (2, 4, 1)),
    _slice(V5E, 16, "4x4", (2, 2, 1)),  # multi-host slices: 4 chips per host
    _slice(V5E, 64, "8x8", (2, 2, 1)),
    _slice(V5E, 256, "16x16", (2, 2, 1)),
    _slice(V6E, 1, "1x1", (1, 1, 1)),
    _slice(V6E, 8, "2x4", (2, 4, 1)),
    _slice(V5P, 4, "2x2x1", (2, 2, 1), name="v5p-8"),
    _slice(V4, 4, "2x2x1", (2, 2, 1), name="v4-8", chip_config="megacore"),
)}


def parse_target(name: str) -> Target:
    """`v5e-8` -> its Target; an unknown name is a ValueError that lists the known ones."""
    key = name.strip().lower().replace("v5litepod", "v5e").replace("v6litepod", "v6e")
    if key not in TARGETS:
        raise UsageError(f"--target {name!r} is not a TPU slice b2t knows: choose one of {', '.join(TARGETS)}")
    return TARGETS[key]
