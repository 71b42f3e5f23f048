"""Tree attention over a KV prefix: one masked call for a whole draft tree, and what it replaces.

Verifying a draft tree (SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024) attends every tree
node to the cached prefix and to its own ancestors in one call, with a "topology-aware" mask.
The naive alternative attends each root-to-leaf candidate sequence separately, repeating the
prefix work once per leaf. This module holds interchangeable implementations of the same
attention, all equal to the eager reference up to rounding:

    "sdpa"          one `scaled_dot_product_attention` call with the tree mask (the default)
    "per_sequence"  the naive baseline: one SDPA call per root-to-leaf sequence, each over a view of
                    its sequence's contiguous prefix cache (no copy of the prefix), its own
                    tokens written into the slots after it, as a static KV cache does
    "eager"         matmul -> softmax -> matmul with an additive 0 / dtype-min mask (the reference)
    "flex"          FlexAttention (Dong et al. 2024, `torch.nn.attention.flex_attention`, compiled)
                    with a `BlockMask` built from the tree; `flex_unsupported` says why not where
                    the installed torch cannot run it

and `CAUSAL`, plain causal attention of the same queries (each sees the prefix and the queries
before it): what a model does for as many new tokens without a tree, the floor a tree mask is
measured against.

Layout of a ragged batch (`TreeBatch`; batch > 1 = several sequences, each with its own prefix
length and its own tree). With P = the longest prefix and M = the largest tree:

    q     [B, Hq,  M,     D]   query rows 0..n_b-1 are sequence b's tree nodes, canonical order
    k, v  [B, Hkv, P + M, D]   positions 0..p_b-1: b's prefix (the root, the last accepted token, is
                               its last position); p_b..P-1: padding; P..P+n_b-1: b's tree nodes;
                               the rest: padding

Node i of sequence b attends to b's whole prefix and to its ancestors and itself in b's tree, and
to nothing else: padding and other sequences are never seen. A padding query row (i >= n_b)
attends only to its own padding slot P + i, so no row is empty (an empty row is NaN in SDPA); its
output is meaningless and `TreeBatch.query_valid` marks the real rows. Hq may be a multiple of Hkv
(grouped-query attention).

Masks and layouts are built once per step by `prepare` (outside any timed region; a model builds
them once and shares them across layers); `Prepared.run()` is the attention alone.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..core.masks import prefix_tree_mask
from ..core.trees import Tree

IMPLEMENTATIONS: tuple[str, ...] = ("sdpa", "per_sequence", "eager", "flex")
REFERENCE = "eager"
CAUSAL = "causal"  # not a tree implementation: the same queries as a plain causal block

# agreement with the reference (max abs error over real rows) on standard-normal inputs (outputs O(1));
# in float16 the reference rounds its probabilities to float16, as transformers' eager attention does
TOLERANCE: dict[torch.dtype, float] = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


class Unsupported(RuntimeError):
    """An implementation cannot run here (the message says why); callers record it as skipped."""


@dataclass(frozen=True)
class TreeBatch:
    """A ragged batch of draft trees over KV prefixes: sequence b has `prefix_lens[b]` cached
    positions (the root last) and the tree `trees[b]`."""

    prefix_lens: tuple[int, ...]
    trees: tuple[Tree, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix_lens", tuple(int(p) for p in self.prefix_lens))
        object.__setattr__(self, "trees", tuple(self.trees))
        if not self.trees or len(self.trees) != len(self.prefix_lens):
            raise ValueError(
                f"need one prefix length per tree and at least one sequence, got "
                f"{len(self.prefix_lens)} prefix lengths and {len(self.trees)} trees"
            )
        if any(p < 1 for p in self.prefix_lens):
            raise ValueError(f"every prefix holds at least the root, got prefix lengths {self.prefix_lens}")
        if any(t.num_nodes == 0 for t in self.trees):
            raise ValueError("every tree needs at least one node")

    @classmethod
    def uniform(cls, prefix_len: int, tree: Tree, batch: int = 1) -> TreeBatch:
        """`batch` copies of one sequence's shape: the same prefix length and tree."""
        return cls((prefix_len,) * batch, (tree,) * batch)

    @classmethod
    def spread(cls, prefix_len: int, tree: Tree, batch: int) -> TreeBatch:
        """A ragged batch: prefix lengths spread evenly from `prefix_len` down to about half of it
        (the first sequence is the longest), one tree shape."""
        lens = tuple(max(1, round(prefix_len * (1 - 0.5 * b / max(batch - 1, 1)))) for b in range(batch))
        return cls(lens if batch > 1 else (prefix_len,), (tree,) * batch)

    @property
    def batch_size(self) -> int:
        return len(self.trees)

    @property
    def prefix_capacity(self) -> int:
        """P: the longest prefix; tree slots start here."""
        return max(self.prefix_lens)

    @property
    def tree_capacity(self) -> int:
        """M: the largest tree, the number of query rows."""
        return max(t.num_nodes for t in self.trees)

    @property
    def kv_len(self) -> int:
        return self.prefix_capacity + self.tree_capacity

    def allowed(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Bool [B, 1, M, P + M], True where a query may attend (see the module docstring).

        Per sequence it is `masks.prefix_tree_mask(tree.ancestor_mask(), p_b)` (what a stock model
        is given to verify the tree), with the prefix padded to P and the tree padded to M.
        """
        P, M = self.prefix_capacity, self.tree_capacity
        out = torch.zeros(self.batch_size, 1, M, P + M, dtype=torch.bool)  # host: moved on return
        pad = torch.arange(M)  # host: indexes the host mask
        for b, (p, tree) in enumerate(zip(self.prefix_lens, self.trees)):
            n = tree.num_nodes
            rows = prefix_tree_mask(tree.ancestor_mask(), p)[0, 0]  # [n, p + n]
            out[b, 0, :n, :p] = rows[:, :p]
            out[b, 0, :n, P : P + n] = rows[:, p:]
            out[b, 0, pad[n:], P + pad[n:]] = True  # padding rows see only their own slot
        return out.to(device) if device is not None else out

    def additive(self, dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
        """Float [B, 1, M, P + M]: 0 where allowed, the dtype's minimum elsewhere (what eager
        attention adds to the scores; a boolean mask there would be silently wrong)."""
        allowed = self.allowed(device)
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )

    def causal(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Bool [B, 1, M, P + M]: the same layout with chains instead of trees (query i sees its
        prefix and queries 0..i of its own sequence)."""
        return TreeBatch(self.prefix_lens, tuple(Tree.chain(t.num_nodes) for t in self.trees)).allowed(device)

    def query_valid(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Bool [B, M]: True on real tree-node rows, False on padding rows."""
        n = torch.tensor([t.num_nodes for t in self.trees])  # host: moved on return
        return (torch.arange(self.tree_capacity)[None] < n[:, None]).to(device)  # host: moved here

    def describe(self) -> str:
        lens = self.prefix_lens
        span = f"{lens[0]}" if len(set(lens)) == 1 else f"{min(lens)}..{max(lens)}"
        trees = self.trees[0].describe() if len(set(self.trees)) == 1 else f"{len(set(self.trees))} different trees"
        return f"batch {self.batch_size}, prefix {span}, {trees}"


@dataclass(frozen=True)
class AttentionInputs:
    """Queries, keys and values of one tree-attention call in the `TreeBatch` layout."""

    q: torch.Tensor  # [B, Hq, M, D]
    k: torch.Tensor  # [B, Hkv, P + M, D]
    v: torch.Tensor  # [B, Hkv, P + M, D]
    batch: TreeBatch

    def __post_init__(self) -> None:
        B, M, S = self.batch.batch_size, self.batch.tree_capacity, self.batch.kv_len
        q, k, v = self.q, self.k, self.v
        if q.dim() != 4 or q.shape[0] != B or q.shape[2] != M:
            raise ValueError(f"q must be [B={B}, Hq, M={M}, D], got {tuple(q.shape)}")
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != B or k.shape[2] != S or k.shape[3] != q.shape[3]:
            raise ValueError(
                f"k and v must be [B={B}, Hkv, P + M={S}, D={q.shape[3]}], got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
        if not (q.dtype == k.dtype == v.dtype and q.device == k.device == v.device):
            raise ValueError("q, k and v must share one dtype and one device")

    @property
    def gqa(self) -> bool:
        return self.q.shape[1] != self.k.shape[1]

    def expanded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v repeated to the query heads [B, Hq, S, D] (grouped-query attention), as a model's
        `repeat_kv` does before a masked attention call: SDPA's enable_gqa together with a mask
        falls back to the slow math kernel on CUDA, which would skew the timing of GQA models."""
        groups = self.q.shape[1] // self.k.shape[1]
        if groups == 1:
            return self.k, self.v
        return self.k.repeat_interleave(groups, dim=1), self.v.repeat_interleave(groups, dim=1)


def random_inputs(
    batch: TreeBatch,
    heads: int,
    head_dim: int,
    kv_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> AttentionInputs:
    """Standard-normal q, k, v in the layout of `batch` (padding slots hold random values too), drawn
    on `device` in `dtype` (no host draw, no copy: a grid point may hold billions of values)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    kv_heads = heads if kv_heads is None else kv_heads
    B, M, S = batch.batch_size, batch.tree_capacity, batch.kv_len

    def draw(h: int, n: int) -> torch.Tensor:
        return torch.randn(B, h, n, head_dim, generator=g, device=device, dtype=dtype)

    return AttentionInputs(draw(heads, M), draw(kv_heads, S), draw(kv_heads, S), batch)


@dataclass(frozen=True)
class Prepared:
    """One implementation with its masks and layouts built; `run()` is the attention alone and
    returns [B, Hq, M, D] (for CAUSAL: the same shape, chain semantics)."""

    impl: str
    inputs: AttentionInputs
    run: Callable[[], torch.Tensor]


def prepare(inputs: AttentionInputs, impl: str = "sdpa") -> Prepared:
    """Build what `impl` needs once (masks, block mask, per-sequence cache), outside any timing.

    Raises `Unsupported` (with the reason) where `impl` cannot run on this torch and device.
    """
    builders = {
        "sdpa": _prepare_sdpa,
        "per_sequence": _prepare_per_sequence,
        "eager": _prepare_eager,
        "flex": _prepare_flex,
        CAUSAL: _prepare_causal,
    }
    if impl not in builders:
        raise ValueError(f"unknown tree attention {impl!r}; choose from {IMPLEMENTATIONS + (CAUSAL,)}")
    with torch.inference_mode():
        return Prepared(impl, inputs, _no_grad(builders[impl](inputs)))


def tree_attention(inputs: AttentionInputs, impl: str = "sdpa") -> torch.Tensor:
    """[B, Hq, M, D]: every tree node attends to its prefix, its ancestors and itself."""
    return prepare(inputs, impl).run()


def max_abs_error(out: torch.Tensor, reference: torch.Tensor, batch: TreeBatch) -> float:
    """Largest |out - reference| over real (non-padding) query rows, in float32."""
    valid = batch.query_valid(out.device)[:, None, :, None]  # [B, 1, M, 1]
    return float(((out.float() - reference.float()).abs() * valid).max())


def _no_grad(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    @functools.wraps(fn)
    def run() -> torch.Tensor:
        with torch.inference_mode():
            return fn()

    return run


# ---- one masked SDPA call ---------------------------------------------------------------------


def _prepare_sdpa(x: AttentionInputs) -> Callable[[], torch.Tensor]:
    mask = x.batch.allowed(x.q.device)  # bool: read as "may attend" by SDPA on every backend
    q, (k, v) = x.q, x.expanded()  # repeated once here, outside the timed call
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _prepare_causal(x: AttentionInputs) -> Callable[[], torch.Tensor]:
    """Plain causal attention in its fastest correct form here: for a uniform batch one lower-right
    causal mask for all (`_causal_mask`: a fused causal kernel on CUDA); for a ragged batch the
    padded causal mask."""
    q, (k, v) = x.q, x.expanded()
    b = x.batch
    if len(set(b.prefix_lens)) == 1 and len({t.num_nodes for t in b.trees}) == 1:
        mask = _causal_mask(b.tree_capacity, b.kv_len, q.device)
    else:
        mask = b.causal(q.device)
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# ---- eager reference --------------------------------------------------------------------------


def _prepare_eager(x: AttentionInputs) -> Callable[[], torch.Tensor]:
    q, k, v = x.q, x.k, x.v
    mask = x.batch.additive(torch.float32, q.device)
    groups = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])

    def run() -> torch.Tensor:
        kk = k.repeat_interleave(groups, dim=1) if groups > 1 else k
        vv = v.repeat_interleave(groups, dim=1) if groups > 1 else v
        scores = torch.matmul(q, kk.transpose(-1, -2)).float() * scale + mask  # [B, Hq, M, P + M]
        return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), vv)

    return run


# ---- the naive baseline: one call per root-to-leaf sequence ------------------------------------


@dataclass(frozen=True)
class _Leaf:
    b: int  # sequence in the batch
    prefix_len: int
    length: int  # L, nodes on the path
    fresh: int  # path positions from here on are written to the output (earlier ones already were)
    write: torch.Tensor  # long [L - fresh]: the output rows (node indices) of those positions
    mask: Any  # bool [L, p + L] lower-right causal, or torch's causal_lower_right bias on CUDA


def _prepare_per_sequence(x: AttentionInputs) -> Callable[[], torch.Tensor]:
    """Each candidate sequence attends as a plain sequence would: its L tokens after the prefix,
    causally. The prefix of sequence b is stored once, contiguously, in a static cache
    [1, Hkv, p_b + depth_b, D] (built here, as prefill would have left it); per leaf the L path
    keys/values are written into the slots after the prefix and SDPA runs over a view of the first
    p_b + L slots. No prefix is ever copied in `run`; the prefix attention is repeated per leaf,
    which is the cost this baseline exists to show."""
    q, batch = x.q, x.batch
    k, v = x.expanded()
    P, M = batch.prefix_capacity, batch.tree_capacity
    device = q.device
    caches: list[tuple[torch.Tensor, torch.Tensor]] = []
    paths: list[tuple[torch.Tensor, torch.Tensor]] = []  # per leaf: its path's k, v [1, Hkv, L, D]
    leaves: list[_Leaf] = []
    path_queries: list[torch.Tensor] = []  # per leaf: its path's queries [1, Hq, L, D]
    for b, (p, tree) in enumerate(zip(batch.prefix_lens, batch.trees)):
        ck = k.new_empty(1, k.shape[1], p + tree.depth, k.shape[3])
        cv = torch.empty_like(ck)
        ck[:, :, :p] = k[b : b + 1, :, :p]
        cv[:, :, :p] = v[b : b + 1, :, :p]
        caches.append((ck, cv))
        done: set[int] = set()
        for path in tree.leaf_paths:
            L = len(path)
            nodes = torch.tensor(path, dtype=torch.long, device=device)
            fresh = next(i for i, node in enumerate(path) if node not in done)  # a leaf is never done
            done.update(path)
            leaves.append(_Leaf(b, p, L, fresh, nodes[fresh:], _causal_mask(L, p + L, device)))
            paths.append(((k[b : b + 1, :, P + nodes]).contiguous(), (v[b : b + 1, :, P + nodes]).contiguous()))
            path_queries.append(q[b : b + 1, :, nodes].contiguous())  # as the sequence's own forward makes them
    n = [t.num_nodes for t in batch.trees]
    pad = [(b, torch.arange(n[b], M, device=device)) for b in range(batch.batch_size) if n[b] < M]

    def run() -> torch.Tensor:
        out = torch.empty_like(q)
        for leaf, (pk, pv), pq in zip(leaves, paths, path_queries):
            ck, cv = caches[leaf.b]
            end = leaf.prefix_len + leaf.length
            ck[:, :, leaf.prefix_len : end] = pk  # this sequence's own tokens after the prefix
            cv[:, :, leaf.prefix_len : end] = pv
            o = F.scaled_dot_product_attention(pq, ck[:, :, :end], cv[:, :, :end], attn_mask=leaf.mask)
            out[leaf.b].index_copy_(1, leaf.write, o[0, :, leaf.fresh :])
        for b, rows in pad:  # padding rows: their own slot only, as in the masked implementations
            out[b, :, rows] = v[b, :, P + rows].repeat_interleave(q.shape[1] // v.shape[1], dim=0)
        return out

    return run


def _causal_mask(queries: int, keys: int, device: torch.device) -> Any:
    """Lower-right causal mask for `queries` new tokens after `keys - queries` cached ones: on CUDA
    torch's `causal_lower_right` bias, which runs fused flash / memory-efficient kernels; elsewhere
    (torch materialises that bias on every call) a boolean mask built once."""
    if device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(queries, keys)
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(diagonal=keys - queries)


# ---- FlexAttention ----------------------------------------------------------------------------


def flex_unsupported(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why FlexAttention cannot run here, or None if this torch offers it for the device (whether
    it compiles is only known by trying: `prepare(..., "flex")` raises `Unsupported` then)."""
    device = torch.device(device)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no FlexAttention ({e})"
    if device.type not in ("cpu", "cuda"):
        return f"FlexAttention is compiled for CPU and CUDA only, not {device.type}"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "FlexAttention on CUDA compiles Triton kernels, and triton is not installed"
    return None


@functools.cache
def _flex_kernel(dynamic: bool) -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process and mode (uncompiled it materialises the full
    scores). dynamic=True on CUDA: one kernel for every grid shape, not a recompile per shape;
    static shapes on CPU, where torch 2.13's automatic dynamic shapes generate C++ that does not
    compile (`cur_kvSplitSize5 was not declared`)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=dynamic)


def flex_kernel_options(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> dict[str, int]:
    """Triton block sizes for GPUs below compute capability 8.0 (e.g. the T4, 7.5, 64 KB of shared
    memory per block): torch's defaults for float16 and head_dim 128 need about that much and fail
    to launch; 32 x 32 blocks with one pipeline stage need a quarter of it. Newer GPUs and the CPU
    keep torch's defaults (an empty dict)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0):
        return {}
    return {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4} if head_dim >= 64 else {"num_stages": 1}


def block_mask(batch: TreeBatch, device: torch.device | str, block_size: int = 128):
    """The tree mask as a FlexAttention `BlockMask`: blocks wholly inside a prefix are "full"
    (no per-element mask work), blocks wholly outside every allowed position are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    P, M = batch.prefix_capacity, batch.tree_capacity
    prefix = torch.tensor(batch.prefix_lens, device=device)
    nodes = torch.tensor([t.num_nodes for t in batch.trees], device=device)
    tree = batch.allowed(device)[:, 0, :, P:]  # [B, M, M]: ancestors (and padding rows' own slot)

    def mask_mod(b, h, q_idx, kv_idx):
        t = kv_idx - P
        in_prefix = (kv_idx < prefix[b]) & (q_idx < nodes[b])  # padding rows see no prefix
        return in_prefix | ((t >= 0) & tree[b, q_idx, t.clamp(min=0)])

    return create_block_mask(mask_mod, batch.batch_size, None, M, P + M, device=device, BLOCK_SIZE=block_size)


def _prepare_flex(x: AttentionInputs) -> Callable[[], torch.Tensor]:
    reason = flex_unsupported(x.q.device, x.q.dtype)
    if reason:
        raise Unsupported(reason)
    mask = block_mask(x.batch, x.q.device)
    import torch._dynamo

    on_cuda = x.q.device.type == "cuda"
    kernel = _flex_kernel(dynamic=on_cuda)
    options = flex_kernel_options(x.q.device, x.q.dtype, x.q.shape[-1])
    q, k, v, gqa = x.q, x.k, x.v, x.gqa  # FlexAttention's GQA reads the shared heads by index: no repeat
    run = lambda: kernel(q, k, v, block_mask=mask, enable_gqa=gqa, kernel_options=options or None)  # noqa: E731
    try:
        # Compile for this shape now (`_flex_kernel`: static shapes on CPU, dynamic on CUDA). A grid
        # has many shapes, so lift dynamo's recompile limit for this call and fail loudly rather than
        # fall back, uncompiled, to a kernel that materialises every score (the wrong thing to time).
        with torch._dynamo.config.patch(
            recompile_limit=100_000, accumulated_recompile_limit=100_000, fail_on_recompile_limit_hit=True
        ):
            run()
    except Exception as e:  # inductor raises many kinds (no compiler, unsupported dtype, ...)
        where = (
            f"{torch.cuda.get_device_name(x.q.device)} (compute capability "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(x.q.device)))}, "
            f"kernel options {options or 'default'})"
            if on_cuda
            else "CPU"
        )
        raise Unsupported(
            f"FlexAttention failed to compile or run on {where}: {type(e).__name__}: {str(e)[:300]}"
        ) from e
    return run


def check_against_reference(inputs: AttentionInputs, impls: Sequence[str] = IMPLEMENTATIONS) -> list[dict]:
    """One row per implementation: its max abs error against the eager reference on real rows,
    the tolerance for the dtype, and whether it passed (or why it was skipped)."""
    reference = tree_attention(inputs, REFERENCE)
    tol = TOLERANCE.get(inputs.q.dtype, 1e-2)
    rows = []
    for impl in impls:
        try:
            err = max_abs_error(tree_attention(inputs, impl), reference, inputs.batch)
            rows.append({"impl": impl, "max_abs_error": err, "tolerance": tol, "ok": err <= tol, "note": ""})
        except Unsupported as e:
            rows.append({"impl": impl, "max_abs_error": float("nan"), "tolerance": tol, "ok": None, "note": str(e)})
    return rows
