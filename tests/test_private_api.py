"""The private torch / torch_xla APIs b2t depends on (all in b2t/private_api.py) still exist
and still do what b2t relies on: an upgrade that breaks them fails here, by name."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch_xla

from b2t.private_api import (
    aot_autograd,
    autograd_excluded,
    autograd_inside_op,
    bridge_compiles_handed_off,
    buffer_donated,
    ctc_alpha,
    ctc_alpha_backward,
    data_handles,
    donate_buffer,
    graph_breaks,
    graph_data_handles,
    gru_layer,
    has_pending_graph,
    is_placeholder,
    openxla_eval_boxed,
    raise_recompile_limit,
    scalars_as_device_data,
    scan_no_grad,
    sharding_spec,
    special_scalars_handled,
    warm_up_cache,
)

REPO = Path(__file__).resolve().parents[1]
DEVICE = torch_xla.device()


def test_the_private_names_exist():
    for name in ("_ForceDispatchKeyGuard", "_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set"):
        assert hasattr(torch._C, name), f"torch._C.{name} is gone: update b2t/private_api.py"
    for key in ("AutogradFunctionality", "ADInplaceOrView"):
        assert hasattr(torch._C.DispatchKey, key), f"DispatchKey.{key} is gone: update b2t/private_api.py"
    assert hasattr(torch_xla._XLAC, "_set_xla_handle_special_scalars"), "update b2t/private_api.py"


@torch.library.custom_op("b2t_test::probe_keys", mutates_args=())
def _probe(x: torch.Tensor) -> torch.Tensor:
    """Inside a custom op's kernel: autograd off, then back on under `autograd_inside_op`,
    with autocast exactly as it was (the trap: the exclusion set also switches autocast)."""
    before = torch._C._dispatch_tls_local_exclude_set()
    excluded_outside = autograd_excluded()
    with autograd_inside_op():
        inside = torch._C._dispatch_tls_local_exclude_set()
        leaf = x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad((leaf * leaf).sum(), leaf)
        excluded_inside = autograd_excluded()
        autocast_same = all((k in repr(before)) == (k in repr(inside)) for k in ("AutocastXLA", "AutocastCPU"))
    return torch.stack([torch.tensor(float(v)) for v in (excluded_outside, excluded_inside, autocast_same)] +
                       [(grad - 2 * x).abs().max().to("cpu")])


@_probe.register_fake
def _(x):
    return x.new_empty((4,))


def test_autograd_comes_back_inside_a_custom_op_and_autocast_does_not():
    x = torch.arange(3.0)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            excluded_outside, excluded_inside, autocast_same, grad_error = _probe(x).tolist()
        assert excluded_outside == 1.0, "a custom op kernel no longer runs with autograd excluded"
        assert excluded_inside == 0.0 and grad_error == 0.0
        assert autocast_same == 1.0, "autograd_inside_op changed the autocast keys"


def test_scalars_stay_device_data():
    with special_scalars_handled(True):
        scalars_as_device_data()
        t = torch.zeros((), device="cpu").to(torch_xla.device())
        assert "device_data" in torch_xla._XLAC._get_xla_tensors_text([t])
        with special_scalars_handled(True):
            t = torch.zeros((), device="cpu").to(torch_xla.device())
            assert "device_data" not in torch_xla._XLAC._get_xla_tensors_text([t])


def test_the_wrapped_private_names_exist():
    """The names behind b2t.private_api's thin wrappers (each also runs in a test below)."""
    import torch._dynamo.backends.common as common
    import torch._dynamo.backends.torchxla as bridge

    for name in ("_get_xla_sharding_spec", "_get_local_shards", "_get_local_shard_replica_and_indices",
                 "_xla_warm_up_cache", "_get_graph_hash", "_xla_get_num_cached_compilation_graph",
                 "_xla_get_tensor_id", "_get_tensors_xla_device_data_node",
                 "_get_xla_tensor_debug_info", "_run_cached_graph", "_check_tensor_need_materialization",
                 "_clear_pending_irs", "_get_xla_enable_device_data_cache", "_set_xla_enable_device_data_cache"):
        assert hasattr(torch_xla._XLAC, name), f"torch_xla._XLAC.{name} is gone: update b2t/private_api.py"
    assert callable(common.aot_autograd) and callable(bridge.openxla_eval_boxed), "update b2t/private_api.py"
    assert isinstance(torch._dynamo.config.recompile_limit, int), "update b2t/private_api.py"
    assert hasattr(torch._VF, "gru"), "torch._VF.gru is gone: update b2t/private_api.py"
    import torch_xla.experimental.scan as xla_scan

    assert callable(getattr(xla_scan, "_scan_impl_pytree", None)), "scan's _scan_impl_pytree is gone: update b2t/private_api.py"
    for op in ("_ctc_loss", "_ctc_loss_backward"):
        assert "Tensor" in getattr(torch.ops.aten, op).overloads(), f"aten::{op}.Tensor is gone: update b2t/private_api.py"


def test_graph_breaks_counts_dynamos_breaks():
    def broken(x):
        return torch.sin(x).sum().item() + 1.0  # .item() breaks the graph

    before = graph_breaks()
    try:
        torch.compile(broken, backend="eager")(torch.ones(3))
    finally:
        torch._dynamo.reset()
    assert graph_breaks() > before


def test_a_graph_is_compiled_unrun_and_its_inputs_are_named_by_their_data_handles():
    """The TPU check's trace (b2t.plan.capture): an in-place update leaves its input named by the
    tensor's first data handle; the pending graph compiles without running (one more compilation)."""
    import torch_xla.debug.metrics as met

    w, x, u = (torch.arange(6.0).reshape(2, 3).to(torch_xla.device()) + 0 for _ in range(3))
    torch_xla.sync()
    before = data_handles([w, x])
    assert not has_pending_graph(w)
    w.mul_(0.5).add_(x)  # an update, as AdamW's
    assert has_pending_graph(w)
    assert set(graph_data_handles([w])) >= set(before)
    compiled = met.metric_data("CompileTime")[0]
    key, new = warm_up_cache([w])
    assert new and met.metric_data("CompileTime")[0] == compiled + 1
    assert warm_up_cache([u.sub(x)])[1]  # another graph
    assert warm_up_cache([u.mul(0.5).add(x)]) == (key, False)  # the first one again: cached, nothing compiled
    assert torch.equal(w.cpu(), torch.arange(6.0).reshape(2, 3) * 1.5)  # still computable after


def test_an_asynchronous_results_data_handle_is_the_one_it_keeps():
    """A sync returns before its graph has run; the result's handle must not change when the
    buffer arrives (CI failed the test above when the `+ 0` graph was still running)."""
    import torch_xla.core.xla_model as xm

    a = torch.randn(600, 600).to(DEVICE)
    torch_xla.sync()
    xm.wait_device_ops()
    for _ in range(3):
        w = a
        for _ in range(8):
            w = w @ a  # long enough to be running still when the handle is read
        torch_xla.sync()
        early = data_handles([w])
        xm.wait_device_ops()
        assert data_handles([w]) == early


def test_a_donated_buffer_joins_the_step_barriers_own_donors_and_is_consumed():
    """`donate_buffer` (b2t.engine.backend.Backend.donate): at a sync the offered buffer is a donor
    beside the one torch_xla finds itself (an in-place update), so both are aliased, and the
    offered tensor's buffer is gone after the graph ran; a pending result cannot be offered."""
    import torch_xla.debug.metrics as met

    read, updated = (torch.full((4, 2), float(i)).to(DEVICE) for i in (1, 2))
    torch_xla.sync()
    assert donate_buffer(read) and buffer_donated(read)
    assert not buffer_donated(updated)
    total = read * 3
    updated += 1
    assert not donate_buffer(updated), "a pending result has no buffer to offer"
    torch_xla.sync(wait=True)
    assert met.metric_data("InputOutputAliasCount")[2][-1][1] == 2.0, "the offered buffer and the in-place one"
    assert torch.equal(total.cpu(), torch.full((4, 2), 3.0)) and torch.equal(updated.cpu(), torch.full((4, 2), 3.0))
    with pytest.raises(RuntimeError):
        read.cpu()  # its buffer was donated to the graph


def test_gru_layer_computes_the_gru_equations():
    """torch's GRU kernel, checked against the equations (nn.GRU itself may be torch_xla's scan GRU
    in a process that imported torch_xla.experimental.gru)."""
    g = torch.Generator().manual_seed(0)
    B, P, D, H = 3, 4, 5, 7
    x, h = torch.randn(B, P, D, generator=g), torch.randn(1, B, H, generator=g)
    w_ih, w_hh, b_ih, b_hh = (torch.randn(*shape, generator=g) for shape in ((3 * H, D), (3 * H, H), (3 * H,), (3 * H,)))
    got = gru_layer(x.transpose(0, 1), h, [w_ih, w_hh, b_ih, b_hh]).transpose(0, 1)  # time-major
    state, expected = h[0], []
    for t in range(P):
        xr, xz, xn = (x[:, t] @ w_ih.T + b_ih).chunk(3, dim=1)
        hr, hz, hn = (state @ w_hh.T + b_hh).chunk(3, dim=1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        state = (1 - z) * torch.tanh(xn + r * hn) + z * state
        expected.append(state)
    torch.testing.assert_close(got, torch.stack(expected, dim=1), rtol=1e-5, atol=1e-5)


def test_scan_no_grad_walks_the_steps_in_either_direction_and_keeps_the_carrys_other_fields():
    """A running sum over the leading dim, forward and reversed, with a loop-invariant tensor in
    the carry (how the GRU's backward carries its recurrent weight)."""
    xs = torch.arange(12.0).reshape(4, 3)
    scale = torch.tensor([1.0, 2.0, 3.0])

    def step(carry, x):
        total = carry["total"] + x * carry["scale"]
        return {**carry, "total": total}, total

    for reverse in (False, True):
        carry, ys = scan_no_grad(step, {"total": torch.zeros(3, device=DEVICE), "scale": scale.to(DEVICE)},
                                 xs.to(DEVICE), reverse=reverse)
        order = xs.flip(0) if reverse else xs
        want = (order * scale).cumsum(0)
        torch.testing.assert_close(ys.cpu(), want.flip(0) if reverse else want)
        torch.testing.assert_close(carry["scale"].cpu(), scale)


def test_ctc_alpha_and_its_backward_are_torchs_ctc_loss():
    """The NLL per row and its gradient from aten's `_ctc_loss` pair equal `F.ctc_loss`'s (no
    reduction); the second row's target cannot fit its frames: an inf NLL and a zero gradient."""
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(12, 2, 5, generator=g).log_softmax(-1).requires_grad_(True)
    targets = torch.tensor([[1, 2, 2, 3], [4, 4, 4, 4]])
    input_lengths, target_lengths = torch.tensor([12, 6]), torch.tensor([4, 4])
    expected = torch.nn.functional.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="none")
    (expected_grad,) = torch.autograd.grad(expected[:1].sum(), log_probs)
    with torch.no_grad():
        nll, alpha = ctc_alpha(log_probs, targets, input_lengths, target_lengths, 0)
        grad = ctc_alpha_backward(torch.tensor([1.0, 0.0]), log_probs, targets, input_lengths, target_lengths, nll, alpha, 0)
    assert torch.isinf(nll[1]) and alpha.shape == (2, 12, 9)
    torch.testing.assert_close(nll[:1], expected[:1])
    torch.testing.assert_close(grad[:, 0], expected_grad[:, 0])
    assert not grad[:, 1].any(), "an infeasible row gets no gradient (F.ctc_loss's own is NaN there)"


def test_an_xla_scope_names_the_ops_traced_inside_it():
    code = ("import torch, torch_xla\n"
            "from b2t.private_api import push_xla_scope\n"
            "x = torch.ones(4).to(torch_xla.device())\n"
            "outer = push_xla_scope('outer'); inner = push_xla_scope('inner'); y = x * 3\n"
            "del inner; z = y + 1; del outer; w = z - 2\n"
            "print(torch_xla._XLAC._get_xla_tensors_hlo([w]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "PJRT_DEVICE": "CPU", "XLA_HLO_DEBUG": "1", "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr[-2000:]
    names = set(re.findall(r'op_name="([^"]*)"', run.stdout))
    assert any(n.startswith("outer.") and "/inner." in n and n.endswith("aten__mul") for n in names), names
    assert any(n.startswith("outer.") and "inner" not in n and n.endswith("aten__add") for n in names), names
    assert any(n.endswith("aten__sub") and "outer" not in n for n in names), names


def test_raise_recompile_limit_never_lowers_it():
    before = torch._dynamo.config.recompile_limit
    try:
        raise_recompile_limit(before + 5)
        assert torch._dynamo.config.recompile_limit == before + 5
        raise_recompile_limit(1)
        assert torch._dynamo.config.recompile_limit == before + 5
    finally:
        torch._dynamo.config.recompile_limit = before


def test_the_bridge_compiles_a_graph_through_aot_autograd():
    """The SPMD openxla compiler's parts: AOTAutograd with torch_xla's bridge as forward compiler."""
    calls = []

    def forward_compiler(gm, inputs):
        calls.append(len(inputs))
        return openxla_eval_boxed(gm, inputs)

    fn = torch.compile(lambda x: x * 3 + 1, backend=aot_autograd(fw_compiler=forward_compiler), dynamic=False)
    x = torch.arange(4.0).to(torch_xla.device())
    assert fn(x).cpu().tolist() == [1.0, 4.0, 7.0, 10.0] and calls == [1]
    torch._dynamo.reset()


@pytest.mark.parametrize("real_outputs", [True, False], ids=["zeros", "placeholders"])
def test_the_bridges_compile_is_handed_to_a_job_and_its_run_stood_in_for(real_outputs):
    """Inside: the graph compiles in the job handed over, and its run returns stand-ins of its
    outputs (zeros, or buffer-less placeholders); after: the function runs the graph the job
    compiled, compiling nothing more."""
    import torch_xla.debug.metrics as met

    compilations = lambda: int((met.metric_data("CompileTime") or [0])[0])  # noqa: E731
    fn = torch.compile(lambda x: (x * 3 + 1).sin(), backend="openxla", dynamic=False)
    x = torch.arange(4.0 + real_outputs).to(DEVICE)  # a shape of its own per case: nothing cached
    threads = []
    with ThreadPoolExecutor(1) as pool, bridge_compiles_handed_off(
            lambda job: pool.submit(lambda: (threads.append(threading.get_ident()), job())),
            real_outputs=real_outputs) as handed:
        before = compilations()
        out = fn(x)
        handed[0][0].result()
    assert len(handed) == 1 and handed[0][1], "one graph handed off, and compiled by its job"
    assert threads and threads[0] != threading.get_ident() and compilations() == before + 1
    assert is_placeholder(out) != real_outputs
    if real_outputs:
        assert torch.equal(out.cpu(), torch.zeros(len(x)))
    assert torch.allclose(fn(x).cpu(), (x.cpu() * 3 + 1).sin()) and compilations() == before + 1
    torch._dynamo.reset()


def test_an_unsharded_tensor_has_no_sharding_spec():
    assert sharding_spec(torch.zeros(3).to(torch_xla.device())) == ""


SHARDS_PROBE = """
import numpy as np, torch, torch_xla, torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
from b2t.private_api import local_shard_indices, local_shards, sharding_spec
xr.use_spmd()
t = torch.arange(6.0).reshape(3, 2).to(torch_xla.device())
xs.mark_sharding(t, xs.Mesh(np.arange(2), (2, 1)), (0, None))
print(sharding_spec(t))
print([(d.tolist(), n) for d, n in local_shards(t)])
print([[(s.start, s.stop) for s in index] for _, index in local_shard_indices(t)])
"""


@pytest.mark.slow
def test_local_shards_and_their_places_on_a_two_device_mesh():
    """Slow twin of the sharding sentinels (a fresh SPMD process, about 13 s; the default suite's
    fsdp probe reads shards through the same wrappers)."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    out = subprocess.run([sys.executable, "-c", SHARDS_PROBE], env=env, capture_output=True, text=True, check=True)
    spec, shards, indices = out.stdout.strip().splitlines()[-3:]
    assert spec == "{devices=[2,1]0,1}"
    assert shards == "[([[0.0, 1.0], [2.0, 3.0]], 'CPU:0'), ([[4.0, 5.0], [0.0, 0.0]], 'CPU:1')]", "a padded last shard"
    assert indices == "[[(0, 2), (0, 2)], [(2, 3), (0, 2)]]"


PRIVATE_ROOTS = ("torch", "torch_xla", "functorch")
SCANNED = ("b2t", "preprocess", "tools")


def _private_uses(path: Path) -> list[str]:
    """`torch...._name` attribute chains and imports of private torch/torch_xla modules or names
    in `path`'s code, aliases followed (`import torch_xla.core.xla_model as xm; xm._x` counts)."""
    nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
    aliases = {root: root for root in PRIVATE_ROOTS}
    found = []

    def private(dotted: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))

    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PRIVATE_ROOTS:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if private(a.name):
                        found.append(f"{path}:{node.lineno} import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PRIVATE_ROOTS:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if private(f"{node.module}.{a.name}"):
                    found.append(f"{path}:{node.lineno} from {node.module} import {a.name}")
    inner_links = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}
    for node in nodes:
        if isinstance(node, ast.Attribute) and id(node) not in inner_links:  # whole chains only
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                dotted = ".".join([aliases[inner.id], *reversed(chain)])
                if private(dotted):
                    found.append(f"{path}:{node.lineno} {dotted}")
    return sorted(set(found))


def test_no_private_torch_name_outside_private_api():
    files = [p for root in SCANNED for p in (REPO / root).rglob("*.py") if p != REPO / "b2t" / "private_api.py"]
    uses = [use for p in files for use in _private_uses(p)]
    assert not uses, "private torch/torch_xla names belong in b2t/private_api.py:\n" + "\n".join(uses)


def test_the_private_name_scan_sees_aliases(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch_xla.core.xla_model as xm\nfrom torch._dynamo import config\nimport torch\n"
                     "xm._hidden()\ntorch.nn.functional.relu\ntorch._C.foo\n")
    uses = [u.split(" ", 1)[1] for u in _private_uses(probe)]
    assert "torch_xla.core.xla_model._hidden" in uses and "from torch._dynamo import config" in uses
    assert any(u.startswith("torch._C") for u in uses) and not any("relu" in u for u in uses)
