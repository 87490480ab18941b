"""Per-device bytes of the training state, replicated (`--mesh data=N`) vs sharded (`--mesh fsdp=N`).

Builds the model of a config on N virtual XLA devices (on the CPU: CPU_NUM_DEVICES, 8 by
default), makes its stepper on each mesh in turn (which shards weights, gradients and AdamW
moments under fsdp), runs two training steps on an all-padding batch, then reads back what
torch_xla reports each device holds: the local shards of every parameter, gradient and
moment (`b2t.engine.mesh.device_bytes`). Prints one row per mesh and the ratio of the
sharded figure to 1/N of the replicated one.

    python tools/fsdp_memory.py [--devices 8] [--set model.gru.n_units=256]
"""

from __future__ import annotations

import os

import click

from b2t.config import TINY_CONFIG, MeshConfig, load_config
from b2t.contract import BucketShape, empty_batch


def training_state_bytes(mesh_cfg: MeshConfig, overrides: tuple[str, ...], shape: BucketShape) -> dict[str, int]:
    """The most bytes any one device holds of the weights, gradients and moments after two
    steps on `mesh_cfg` (under fsdp each holds 1/fsdp of every evenly split tensor)."""
    from b2t.contract import Batch
    from b2t.engine.backend import enable_spmd, make_backend
    from b2t.engine.mesh import device_bytes
    from b2t.engine.step import make_stepper

    cfg = load_config(TINY_CONFIG, ["train.backend=xla", *overrides])
    backend = make_backend("xla", mesh=enable_spmd(mesh_cfg, "xla"))
    stepper = make_stepper(cfg, 4, backend)
    model, optimizer = stepper.model, stepper.optimizer
    for step in (1, 2):
        stepper.train_step([Batch(0, empty_batch(shape), {})], step)
    params = list(model.parameters())
    parts = {"weights": params, "gradients": [p.grad for p in params],
             "AdamW moments": [v for p in params for v in optimizer.state[p].values() if v.shape == p.shape]}
    return {name: max(device_bytes(ts)) for name, ts in parts.items()}


@click.command()
@click.option("--devices", default=8, show_default=True, help="Virtual CPU devices (CPU_NUM_DEVICES).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Config overrides (tiny config).")
def main(devices: int, overrides: tuple[str, ...]) -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", str(devices))
    shape = BucketShape(T=62, B=devices, L=8)
    rows = {mesh: training_state_bytes(cfg, overrides, shape)
            for mesh, cfg in ((f"data={devices}", MeshConfig(data=devices)),
                              (f"fsdp={devices}", MeshConfig(data=1, fsdp=devices)))}
    names = list(next(iter(rows.values())))
    click.echo(f"{'--mesh':12s}" + "".join(f"{n:>16s}" for n in names) + f"{'total':>16s}   (bytes per device)")
    for mesh, parts in rows.items():
        click.echo(f"{mesh:12s}" + "".join(f"{parts[n]:16,d}" for n in names) + f"{sum(parts.values()):16,d}")
    (rep, shard) = (sum(p.values()) for p in rows.values())
    click.echo(f"fsdp={devices} holds {shard / (rep / devices):.3f}x of 1/{devices} of the replicated run's bytes")


if __name__ == "__main__":
    main()
