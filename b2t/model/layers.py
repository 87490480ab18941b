"""Building blocks every model family shares: the per-day input layer, patching, the GRU stack.

- `DayLayer`: one (F, F) weight and (1, F) bias per recording day, stacked into one
  parameter each and indexed by the batch's day ids on the device (the baseline loops over
  days in Python and reads every id back to the host).
- `patches` / `patch_counts`: windows of `size` bins every `stride` bins, built from
  strided slices (`Tensor.unfold` runs on the host under XLA).
- `GRUStack`: torch's own multi-layer GRU parameters plus a learnable initial state, run by
  torch's kernel on CPU/CUDA and as one XLA while-loop per layer on XLA
  (`b2t.model.recurrence`), one custom op under torch.compile (`b2t.model.gru_op`).
- `dropped`: a drawn dropout mask applied (or module dropout where none was drawn), and
  `reverse_gradient`: identity forward, gradient times -scale backward.

Dtypes: parameters are f32 master weights made on the CPU (one seed, the same weights on
every backend); the trainer's bf16 autocast decides what the matmuls compute in.

Shape legend: B batch rows, T time bins, F = 512 features, P patches, D input width,
H hidden units, L layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.rnn import GRU as TorchGRU

from b2t.contract import FEATURE_DIM, PARAM_DTYPE
from b2t.errors import DatasetError, UsageError
from b2t.model.gru_op import gru_stack
from b2t.model.masks import DropoutMask

CPU = torch.device("cpu")
"""Where parameters are made by default: one seed gives the same weights whatever device
runs the model (the trainer moves it); `meta` builds one without memory (parameter counts)."""
GRU_PARAM_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
"""Per layer k, torch's GRU parameters `<kind>_l<k>`, in the order its kernel takes them."""


class DayLayer(nn.Module):
    """`x -> softsign(x @ weight[d] + bias[d])` per row's day d; identity + zero bias at init,
    so each day starts as the plain softsign of its features.

    Parameters `weight` (n_days, F, F) and `bias` (n_days, 1, F); the optimizer gives every
    DayLayer's parameters the day group (`b2t.engine.optim`), whatever the model calls it.
    """

    def __init__(self, n_days: int, dim: int = FEATURE_DIM, *, device: torch.device = CPU) -> None:
        super().__init__()
        if n_days < 1:
            raise DatasetError(f"n_days must be >= 1 (sessions in the manifest), got {n_days}")
        self.n_days = n_days
        eye = torch.eye(dim, dtype=PARAM_DTYPE, device=device)
        self.weight = nn.Parameter(eye.expand(n_days, -1, -1).clone())  # (n_days, F, F)
        self.bias = nn.Parameter(torch.zeros(n_days, 1, dim, dtype=PARAM_DTYPE, device=device))  # (n_days, 1, F)

    def forward(self, x: torch.Tensor, day_indices: torch.Tensor) -> torch.Tensor:
        """(B, T, F) of any float dtype and int32 day ids (B,) -> (B, T, F) in the compute dtype."""
        w = self.weight.index_select(0, day_indices)  # (B, F, F)
        b = self.bias.index_select(0, day_indices)  # (B, 1, F)
        # baddbmm (unlike bmm + b) is on the autocast lists, so its output is the compute dtype
        return F.softsign(torch.baddbmm(b, x.to(self.weight.dtype), w))


def day_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every `DayLayer`'s parameters in `model`, by state-dict name, (n_days, ...) each: the one
    rule for "per-day parameter" (the optimizer's day group, day mapping by session name)."""
    return {f"{name}.{p}".lstrip("."): param for name, m in model.named_modules() if isinstance(m, DayLayer)
            for p, param in m.named_parameters()}


class GRUStack(nn.Module):
    """A batch-first `n_layers` x `n_units` GRU with a learnable initial state `h0` (1, 1, H)
    expanded to every layer and row: (B, P, D) -> (B, P, H).

    The parameters carry torch's GRU names (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`,
    `bias_hh_l0`, ...) and init, as the reference: made by torch's own GRU class (from
    `torch.nn.modules.rnn`, since `import torch_xla` rebinds `torch.nn.GRU` process-wide to
    a class that rejects CPU and CUDA tensors), then `weight_hh` orthogonal, `weight_ih` and
    `h0` xavier-uniform, biases torch's default uniform(+-1/sqrt(H)). They are held here
    rather than in an RNN module because dynamo refuses to touch RNN modules at all.

    On CPU/CUDA the recurrence is torch's GRU kernel (`torch.gru`, what `nn.GRU` calls); on
    XLA it is one while-loop per layer (`recurrence.scan_layers`); under torch.compile one
    custom op with those kernels and a backward shared by both (`gru_op`). The input's device
    picks; the parameters, and so the checkpoints, are the same on every device.
    """

    split_rows: Callable[[torch.Tensor, int], torch.Tensor] | None = None
    """A mesh's row-split constraint along a dim (`SpmdMesh.split_activations` sets it under fsdp),
    for the initial state: expanded from one (1, 1, H) parameter, it tells GSPMD nothing of rows,
    and under openxla the backward module got it whole, so every chip ran the backward's gates
    for every row (docs/tpu.md, "Does each chip do only its share?")."""

    def __init__(self, input_size: int, n_units: int, n_layers: int, dropout: float, *, device: torch.device = CPU) -> None:
        super().__init__()
        self.num_layers, self.hidden_size = n_layers, n_units
        self.dropout = dropout if n_layers > 1 else 0.0
        gru = TorchGRU(input_size, n_units, n_layers, batch_first=True, device=device, dtype=PARAM_DTYPE)
        self.param_names = tuple(f"{kind}_l{k}" for k in range(n_layers) for kind in GRU_PARAM_KINDS)
        for name in self.param_names:
            param = getattr(gru, name)
            if name.startswith("weight_hh"):
                nn.init.orthogonal_(param)
            elif name.startswith("weight_ih"):
                nn.init.xavier_uniform_(param)
            self.register_parameter(name, param)
        self.h0 = nn.Parameter(nn.init.xavier_uniform_(torch.empty(1, 1, n_units, dtype=PARAM_DTYPE, device=device)))

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """(B, P, D) -> (B, P, H). `keep` (L-1, B, P, H): dropout masks between layers (0 or
        1/(1-p)); without them training mode draws its own (`keep_shape`)."""
        h0 = self.h0.expand(self.num_layers, x.shape[0], -1).contiguous()  # (L, B, H)
        if self.split_rows is not None:
            h0 = self.split_rows(h0, 1)
        shape = self.keep_shape(x.shape[0], x.shape[1])
        if keep is None and shape is not None:
            keep = DropoutMask(shape, self.dropout).draw(torch.rand(shape, device=x.device))
        return gru_stack(x, h0, self.weights(), keep)

    def weights(self) -> list[torch.Tensor]:
        """The GRU parameters in torch's flat order (weight_ih, weight_hh, bias_ih, bias_hh per layer)."""
        return [getattr(self, name) for name in self.param_names]

    def keep_shape(self, n_rows: int, n_patches: int) -> tuple[int, ...] | None:
        """(L-1, B, P, H), the between-layer dropout masks; None in eval mode or without dropout."""
        if not self.training or self.dropout == 0:
            return None
        return (self.num_layers - 1, n_rows, n_patches, self.hidden_size)

    def dropout_masks(self, name: str, n_rows: int, n_patches: int) -> dict[str, DropoutMask]:
        """The between-layer mask as a model declares it (`b2t.model.masks`), under `name`;
        none in eval mode or without dropout."""
        shape = self.keep_shape(n_rows, n_patches)
        return {} if shape is None else {name: DropoutMask(shape, self.dropout)}


def check_features(features: torch.Tensor) -> None:
    """Refuse features that are not (B, T, F), with the reason. Any device will do: the
    kernels follow the tensor's device (`gru_op`)."""
    if features.dim() != 3 or features.shape[2] != FEATURE_DIM:
        raise ValueError(f"features must be (B, T, {FEATURE_DIM}), got {tuple(features.shape)}")


def dropped(x: torch.Tensor, keep: torch.Tensor | None, p: float, training: bool) -> torch.Tensor:
    """`x` times its drawn inverted-dropout mask `keep` (`b2t.model.masks`), or, where the
    caller drew none (evaluation, module tests), `F.dropout` with probability `p`."""
    return x * keep if keep is not None else F.dropout(x, p, training)


class _ReverseGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scale)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (scale,) = ctx.saved_tensors
        return -scale.to(grad.dtype) * grad, None


def reverse_gradient(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Identity forward; backward multiplies the gradient by `-scale` (a gradient-reversal layer:
    what comes before it learns to make the loss after it worse).

    `scale` is a tensor (not a float): a per-step value uploaded as device data keeps one graph
    while its schedule ramps (a float would be baked into the trace).
    """
    return _ReverseGradient.apply(x, scale)


def patches(x: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """Windows of `size` bins every `stride` bins, flattened time-major: (B, T, F) -> (B, P, size*F).

    Row p is bins p*stride .. p*stride+size-1 in time order, the element order of the
    baseline's unfold/permute/reshape, with P = (T - size) // stride + 1.

    Built as `size` strided slices of whole bins, (B, P, F) each, concatenated along the
    features: every piece stays F wide, so no dimension of `size` bins (14, not a multiple of
    the TPU's 8-row tiles) is laid out; blocks of `stride` bins cut to `size` (the earlier form)
    made the TPU compiler relay (B, P, size, F) tensors in copies of tens of thousands of LLO
    instructions each (docs/tpu.md, where the compile time goes). The backward is `_Patches`'.
    """
    if x.shape[1] < size:
        raise UsageError(f"need at least patch_size={size} time bins, got T={x.shape[1]}")
    return _Patches.apply(x, size, stride)


class _Patches(torch.autograd.Function):
    """`patches` with the backward of the earlier blocks form: the windows' gradients (B, P,
    size, F) as n = ceil(size/stride) blocks of `stride` bins, each padded to its offset along P,
    added last to first (autograd's order there: the same gradients, bit for bit, in eager) and
    laid out as bins. Not autograd's backward of the strided slices: one interior pad of
    (B, T, F) per slice, which the TPU compiler does not fuse, so openxla's backward module held
    `size` of them at once, each a (B, T, F) buffer of the TPU compiler's temp."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, size: int, stride: int) -> torch.Tensor:
        ctx.shape = (x.shape[1], size, stride)
        span = stride * ((x.shape[1] - size) // stride) + 1  # bins from a window's first to the last window's
        return torch.cat([x[:, j : j + span : stride] for j in range(size)], dim=2)  # (B, P, size*F)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        n_time, size, stride = ctx.shape
        n_batch, n_patches, width = grad.shape  # (B, P, size*F)
        n_feat, n_blocks = width // size, -(-size // stride)
        windows = F.pad(grad.reshape(n_batch, n_patches, size, n_feat), (0, 0, 0, n_blocks * stride - size))
        total = None
        for i in reversed(range(n_blocks)):
            block = windows[:, :, i * stride : (i + 1) * stride]  # (B, P, stride, F)
            block = F.pad(block, (0, 0, 0, 0, i, n_blocks - 1 - i))  # (B, P+n-1, stride, F)
            total = block if total is None else total + block
        bins = total.reshape(n_batch, (n_patches + n_blocks - 1) * stride, n_feat)  # (B, stride*(P+n-1), F)
        if bins.shape[1] >= n_time:
            return bins[:, :n_time], None, None  # bins past the last window get nothing
        return F.pad(bins, (0, 0, 0, n_time - bins.shape[1])), None, None


def patch_counts(n_time_steps: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """`b2t.buckets.patch_count` as tensor ops: int32 patches per length, 0 below `size`.

    Tensor ops only, so it stays on the device inside a compiled step (no host sync).
    """
    # for n < size the floor division gives <= -1, so the clamp returns 0
    counts = torch.div(n_time_steps - size, stride, rounding_mode="floor") + 1
    return counts.clamp(min=0).to(torch.int32)
