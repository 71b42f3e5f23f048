"""How a CPU model runs its linear layers: torch's stock path, or oneDNN on prepacked weights.

A CPU forward of a few tokens is bound by reading the weights. torch's stock `F.linear` (MKL sgemm
on the row-major [out, in] weight) slows as rows are added; oneDNN's matmul on a weight reordered
once into its blocked layout for a small batch (`torch.ops.mkldnn._reorder_linear_weight`, what
torch.compile's CPU backend does to frozen weights) stays closer to one read of the weights per
call. `benchmarks/cpu_verify.py` measures both.

    LINEAR_PATHS   "stock" (nn.Linear as loaded) and "onednn" (PackedLinear); check_linear_path
    effective_path the path a layer on a device in a dtype takes when one is asked for
    pack_linears   swap a float32 CPU model's nn.Linear layers for PackedLinear, in place
    linear_path    which path a loaded model uses ("stock" or "onednn"), for tables and curve keys
    PackedLinear   an nn.Linear whose forward is oneDNN's matmul on the prepacked weight

Exactness: the same products and sums in another order, so outputs differ from the stock path by
float32 rounding only (`tests/test_cpu_linear.py` states the bound). The prepacked weight replaces
the dense one, so memory is unchanged; a weight another module also holds (a tied LM head) is not
packed. `PackedLinear.weight` returns a dense copy at every read (hold on to it). CUDA, 4-bit and
half-precision layers keep the stock path.
"""

from __future__ import annotations

import torch

LINEAR_PATHS = ("stock", "onednn")
PACK_ROWS = 16  # the batch oneDNN's reorder is told to expect (a verify of a few nodes)


class PackedLinear(torch.nn.Module):
    """`nn.Linear` semantics (y = x W^T + b) on a oneDNN-prepacked W. The dense weight is dropped;
    `weight` rebuilds it on access (a copy: reading it is exact, writing to it changes nothing)."""

    def __init__(self, linear: torch.nn.Linear, rows: int = PACK_ROWS) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.bias = linear.bias  # a Parameter or None, shared with the layer it replaces

    @property
    def weight(self) -> torch.Tensor:
        return self.packed_weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, oneDNN prepacked"
        )


def pack_linears(model: torch.nn.Module, path: str = "onednn") -> int:
    """Put `model`'s linear layers on `path` ("stock": nothing to do; "onednn": every plain float32
    nn.Linear on the CPU becomes a PackedLinear, in place). Returns how many layers were packed; 0
    for a model on CUDA, in half precision or 4-bit. A Linear whose weight another module also holds
    (a tied LM head) keeps the stock path: packing it would hold the weight twice. RuntimeError
    when torch was built without oneDNN."""
    check_linear_path(path)
    if path == "stock":
        return 0
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("linear path 'onednn' needs a torch build with oneDNN (mkldnn); use 'stock'")
    shared = {
        id(p)
        for name, m in model.named_modules()
        if type(m) is not torch.nn.Linear
        for p in m.parameters(recurse=False)
    }  # e.g. a tied LM head's weight is the embedding's
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear
        and effective_path(path, module.weight.device, module.weight.dtype) == path
        and id(module.weight) not in shared
    ]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, PackedLinear(module))
    if targets:
        _own_memory(model)
    return len(targets)


def _own_memory(model: torch.nn.Module) -> None:
    """Give every remaining parameter and buffer a copy of its own. transformers loads weights as
    views of the memory-mapped weight file; a single view left (an embedding, a norm, a bias) keeps
    the whole mapping, and every page the packing read, resident. Once nothing views the file, it is
    unmapped."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + [
            b for m in model.modules() for b in m.buffers(recurse=False) if not isinstance(m, PackedLinear)
        ]:
            if tensor.layout == torch.strided:
                tensor.data = tensor.data.clone()


def check_linear_path(path: str) -> None:
    """Refuse an unknown path before any weights load."""
    if path not in LINEAR_PATHS:
        raise ValueError(f"unknown cpu_linear {path!r}; allowed: {LINEAR_PATHS} (stock: torch's own nn.Linear)")


def effective_path(path: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The path a layer on `device` in `dtype` takes when `path` is asked for: "onednn" applies to
    float32 on the CPU only; anything else keeps "stock"."""
    check_linear_path(path)
    return path if torch.device(device).type == "cpu" and dtype == torch.float32 else "stock"


def linear_path(model: torch.nn.Module) -> str:
    """ "onednn" if any of `model`'s layers is a PackedLinear, else "stock"."""
    return "onednn" if any(isinstance(m, PackedLinear) for m in model.modules()) else "stock"
