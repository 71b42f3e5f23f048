"""Will a notebook run fit in this machine's memory? An estimate from the resolved parameters and the
models' configs alone, made before any model loads; `check_run_memory` refuses a run that does not
fit, with the estimate, so that one notebook does not grow until the out-of-memory killer takes it
and whatever else runs beside it.

What it holds:
    LONGEST_PROMPT, RUNTIME, SUPER_CHUNK, SOFTMAX_COPIES, REPLAY_COPIES, ADAM_COPIES, ...
                      the assumptions, each with its reason where it is set
    RunMemory         one notebook's estimate, bytes per part; `total`, `describe()` (one line)
    PART_NAMES, gb    each part's name in words; bytes in GB as the estimates print them
    model_config_of   a model's transformers config without its weights, or why there is none
    forward_bytes     the activations of one forward pass: hidden states, mask, attention scores, logits
    widest_rank       the widest sibling rank of a preset tree (what a collection's top_k must hold)
    estimate_run      a notebook's estimate from its resolved parameters (RULES: the rule its spec names)
    available_bytes   what this machine has: CUDA device 0's total memory, else MemAvailable
    check_run_memory  `ParameterError` naming each notebook that does not fit (`refusal`): its parts
                      in GB, what the machine has, the parameters that size its largest parts (its
                      spec's `lower`)

How the parts are sized (GB = 10^9 bytes; `analysis.memory` does the weight and cache arithmetic):
    weights           target and draft (and 05's heads) as loaded: float32 on a CPU, float16 on CUDA,
                      unless model_dtype says otherwise; "4bit" as transformers' nf4 quantizer leaves
                      it (`analysis.memory.weight_bytes`, its float16 part scaled to the dtype). A draft
                      cut to draft_layers is counted whole: it is cut after it loads. 02 loads its pairs
                      one at a time and keeps a model while a later pair uses it (`experiments.sweeps`):
                      its estimate is its largest pair with what is still held then.
    kv_cache          both models' caches of the longest sequence: LONGEST_PROMPT (05 and 06: at most
                      max_prompt_tokens) + max_new_tokens + the root + the largest tree, in the model
                      dtype, times the batch (06) or the distillation batch (05).
    verify            the largest single forward (`forward_bytes`): the largest tree verified on the
                      longest cache, or the perplexity score of prompt + output in one forward without
                      a cache (`analysis.quality.score`, every notebook that generates).
    continuations     01's and 02's target decoding `batch` prompts at once: their caches of LONGEST_PROMPT
                      + max_new_tokens each and the forward that prefills them (`experiments.continuations`).
    super_trees       01's (and 05's) super-trees: SUPER_CHUNK positions' off-path nodes, one each,
                      fed to the draft in one forward per round (`experiments.collect`), and the draft's
                      cache growing by them (up to super_size = max(dynamic_budgets) each).
    arrays            the collection and its replay: the teacher-forced log q [L + 1, V] and the ranks
                      [L, K + 1] (K the collection's top_k: at least the widest rank of any tree), the
                      replay's child table [N + 1, K + 1] and per-position arrays [positions, N]
                      (`analysis.replay`), Sequoia's tables [K + 1, N + 1] (`analysis.tree_design`).
    grid              03's largest attention-grid point (before its models load): q and the output, k
                      and v, the eager reference's float32 scores (`analysis.memory.attention_grid_bytes`).
    training          05: heads trained in float32 with Adam, their loss logits, the distilled rows.
    runtime           the interpreter, torch and transformers (CPU), or the CUDA context (GPU).

The parts are summed although some never coexist (03's grid runs before its models load; 01's
replay after its collection): an upper bound, within ~2x of what a run measures where the weights
dominate. Attention scores are counted as eager attention makes them (SDPA with a mask may not), and
on CUDA host-side arrays are counted against the device: a refusal errs on the safe side. A model
whose config cannot be read without its weights (an embedded model not installed yet, a hub id
neither committed nor in the local hub cache) counts 0 for its weights, cache and logits, and
`describe()` says so: the estimate never raises for a name it cannot size.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from ..analysis.memory import (
    DTYPE_BYTES,
    GB,
    LONGEST_PROMPT,
    attention_grid_bytes,
    eagle_head_bytes,
    kv_cache_bytes,
    medusa_heads_bytes,
    weight_bytes,
)
from ..core.trees import SPARSE_ACCEPTANCE, Tree
from ..drafters.methods import DYNAMIC, DYNAMIC_MAX_DEPTH, DYNAMIC_TOP_K, parse_method
from ..experiments.checks import ParameterError
from ..io import embedded
from ..io.eagle_checkpoint import PublishedEagle
from ..io.medusa_checkpoint import PublishedHeads
from ..io.model_configs import config_of, known_models
from ..io.published import published_checkpoints
from ..io.tree_spec import TreeSpecError, parse_custom_trees
from . import registry
from .places import NOTEBOOKS

RUNTIME = {"cpu": int(1.0 * GB), "cuda": int(0.5 * GB)}  # interpreter + torch + transformers; the CUDA context
SUPER_CHUNK = 64  # positions whose super-tree nodes, one each, share one draft forward (`CollectConfig.super_chunk`)
SOFTMAX_COPIES = 1  # float32 [rows, V] (log-)softmaxes taken of a forward's logits at once
REPLAY_COPIES = 6  # float64/int64 [positions, nodes] arrays alive at once in a replay (`analysis.replay`)
ADAM_COPIES = 4  # a trained float32 parameter: itself, its gradient, Adam's two moments
MEDUSA_NEGATIVES = 2048  # `training.medusa.MedusaConfig.negatives`: unseen tokens in a "sampled" loss
COLLECTION_TOP_K = 16  # `PairCollectConfig.top_k`: ranks a collection keeps at least
FLOAT32 = 4

PART_NAMES = {
    "weights": "weights",
    "kv_cache": "KV cache",
    "verify": "verify activations",
    "continuations": "batched continuations",
    "super_trees": "super-trees",
    "arrays": "collection/replay arrays",
    "grid": "attention grid",
    "training": "training",
    "runtime": "runtime",
}


@dataclass(frozen=True)
class RunMemory:
    """One notebook's estimate in bytes, part by part (module docstring); `total` sums them."""

    notebook: str
    device: str  # "cpu" or "cuda": what the parts are sized for
    dtype: str  # the models' dtype (4-bit layers apart)
    weights: int = 0
    kv_cache: int = 0
    verify: int = 0
    continuations: int = 0  # the target decoding `batch` prompts at once: their caches and prefill
    super_trees: int = 0
    arrays: int = 0
    grid: int = 0
    training: int = 0
    runtime: int = 0
    notes: tuple[str, ...] = ()  # what was left out or assumed (models that could not be sized)

    def parts(self) -> dict[str, int]:
        """Part -> bytes, in PART_NAMES' order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in PART_NAMES}

    @property
    def total(self) -> int:
        return sum(self.parts().values())

    def describe(self) -> str:
        """One line: the total and its non-zero parts in GB, the device and dtype, the notes."""
        parts = " + ".join(f"{PART_NAMES[k]} {gb(v)}" for k, v in self.parts().items() if v)
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        return f"{self.notebook}: ~{gb(self.total)} GB = {parts or '0'} ({self.device}, {self.dtype}{notes})"


def gb(n: int) -> str:
    """Bytes in GB: one decimal from 0.1 GB, two below, "<0.01" under that."""
    return f"{n / GB:.1f}" if n >= 0.1 * GB else f"{n / GB:.2f}" if n >= 0.01 * GB else "<0.01"


# ---- models ------------------------------------------------------------------------------------


def model_config_of(name: str) -> tuple[PretrainedConfig | None, str]:
    """(config, "") for a model specnb can size without touching its weights, else (None, why): a
    config.json or a folder holding one, an installed embedded model (`io.embedded.model_config`), a
    hub id in the local hub cache (what will load: a dry run's stand-ins; no request is made), else
    its committed config (`io.model_configs`)."""
    path = Path(name).expanduser()
    try:
        if path.is_file() or (path / "config.json").is_file():
            return AutoConfig.from_pretrained(path), ""
        if name in embedded.EMBEDDED_MODELS:
            model = embedded.EMBEDDED_MODELS[name]
            if embedded.missing_parts(model):
                return None, f"{name}: embedded model not installed, not counted"
            return embedded.model_config(model), ""
        if "/" in name:
            with contextlib.suppress(OSError, ValueError):  # what will load: the local hub cache first
                return AutoConfig.from_pretrained(name, local_files_only=True), ""
        if name in known_models():
            return config_of(name), ""
    except (OSError, ValueError, KeyError, embedded.ModelNotInstalledError, embedded.ChecksumError) as e:
        return None, f"{name}: config unreadable ({str(e).splitlines()[0][:80]}), not counted"
    return None, f"{name}: unknown model, not counted"


@dataclass(frozen=True)
class _Model:
    """One model as a run loads it: its config (None: unsized), quantization, kept layers."""

    name: str
    config: PretrainedConfig | None
    quantization: str | None = None
    layers: int | None = None

    def weights(self, dtype_bytes: int) -> int:
        """The whole model as loaded (a draft's layers are cut after loading)."""
        if self.config is None:
            return 0
        try:
            w = weight_bytes(self.config, self.quantization)
        except ImportError:  # 4-bit without bitsandbytes: float16 everywhere, an upper bound
            w = weight_bytes(self.config, None)
        return w.quantized + w.unquantized * dtype_bytes // DTYPE_BYTES["float16"]

    def kv(self, tokens: int, dtype_bytes: int) -> int:
        if self.config is None:
            return 0
        config = self.config
        if self.layers is not None and self.layers < config.num_hidden_layers:
            config = copy.copy(config)
            config.num_hidden_layers = self.layers
        return kv_cache_bytes(config, tokens, dtype_bytes)

    @property
    def vocab(self) -> int:
        return int(getattr(self.config, "vocab_size", 0) or 0)


def _load(
    name: str, quantization: str | None = None, layers: int | None = None, notes: list[str] | None = None
) -> _Model:
    if not name:
        return _Model("", None)
    config, why = model_config_of(name)
    if why and notes is not None and why not in notes:
        notes.append(why)
    return _Model(name, config, quantization, layers)


def _shape(config: PretrainedConfig | None) -> tuple[int, int, int, int, int]:
    """(heads, kv heads, head size, hidden, intermediate) of a config; zeros for None."""
    if config is None:
        return 0, 0, 0, 0, 0
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    hidden = int(config.hidden_size)
    return heads, kv_heads, head_dim, hidden, int(getattr(config, "intermediate_size", None) or 4 * hidden)


def forward_bytes(
    config: PretrainedConfig | None,
    rows: int,
    cache: int,
    dtype_bytes: int,
    logits_rows: int | None = None,
    float_rows: int | None = None,
    batch: int = 1,
) -> int:
    """The activations of one forward of `rows` new tokens per sequence on `cache` cached ones, for
    `batch` sequences; one layer's at a time, as the layers run in turn:
        hidden      rows x (4 hidden + 3 intermediate) in the model dtype (residual, norm, attention
                    projections, MLP gate, up and activation)
        mask        rows x (cache + rows): the bool visibility and the 4D mask in the model dtype
        scores      heads x rows x (cache + rows) float32, twice (eager attention: scores, softmax)
        logits      logits_rows (default rows) x vocab in the model dtype, and of float_rows (default
                    logits_rows) x vocab in float32: the .float() copy (none for a float32 model)
                    and SOFTMAX_COPIES (log-)softmaxes
    A config of None (an unsized model) counts the mask alone."""
    heads, _, _, hidden, intermediate = _shape(config)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    logits_rows = rows if logits_rows is None else logits_rows
    float_rows = logits_rows if float_rows is None else float_rows
    keys = cache + rows
    per_sequence = (
        rows * (4 * hidden + 3 * intermediate) * dtype_bytes
        + rows * keys * (1 + dtype_bytes)
        + 2 * heads * rows * keys * FLOAT32
        + logits_rows * vocab * dtype_bytes
        + float_rows * vocab * FLOAT32 * (SOFTMAX_COPIES + (dtype_bytes != FLOAT32))
    )
    return batch * per_sequence


# ---- trees and methods -------------------------------------------------------------------------


def _custom_trees(*specs: Any, notes: list[str]) -> dict[str, Tree]:
    """Custom trees by name; a spec that is not a tree is left out (the runner refuses it first)."""
    out: dict[str, Tree] = {}
    for spec in specs:
        try:
            out.update(parse_custom_trees(spec))
        except TreeSpecError as e:
            notes.append(f"custom_trees not sized ({str(e).splitlines()[0][:60]})")
    return out


def widest_rank(shape: str, nodes: int) -> int:
    """The widest sibling rank of `Tree.preset(shape, nodes)`, without building it: chain 0, wide
    nodes - 1, kary<k> and beams<k> k - 1 (fewer nodes: nodes - 1); bounds for sparse (below
    len(SPARSE_ACCEPTANCE)) and an unknown shape (nodes - 1)."""
    width = {"chain": 1, "sparse": len(SPARSE_ACCEPTANCE)}.get(shape, nodes)
    for prefix in ("kary", "beams"):
        if shape.startswith(prefix) and shape[len(prefix) :].isdigit():
            width = int(shape[len(prefix) :])
    return max(min(nodes, width) - 1, 0)


@dataclass(frozen=True)
class _TreeSize:
    shape: str  # a preset, "dynamic", or a custom tree's name
    nodes: int
    widest: int  # the widest sibling rank


def _tree_sizes(
    shapes: Iterable[str], budgets: Iterable[int], methods: Iterable[str], custom: Mapping[str, Tree]
) -> list[_TreeSize]:
    """Every tree a notebook builds: each shape at each budget, each method spec that names a tree
    (autoregressive and specs that do not parse are left out), each custom tree."""
    out = [_TreeSize(s, int(b), widest_rank(s, int(b))) for s in shapes for b in budgets]
    out += [_TreeSize(n, t.num_nodes, max(t.ranks, default=0)) for n, t in custom.items()]
    for spec in methods:
        try:
            m = parse_method(spec, dict(custom))
        except (ValueError, KeyError):
            continue
        if m.shape in custom:
            out.append(_TreeSize(m.shape, m.budget, max(custom[m.shape].ranks, default=0)))
        else:
            out.append(_TreeSize(m.shape, m.budget, widest_rank(m.shape, m.budget)))
    return out


# ---- the parts ---------------------------------------------------------------------------------


def _int(p: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = p.get(name)
    return default if value is None else int(value)


def _ints(p: Mapping[str, Any], name: str) -> list[int]:
    return [int(v) for v in p.get(name) or [] if v is not None]


def _verify(
    config: PretrainedConfig | None, nodes: int, cache: int, new: int, dtype_bytes: int, prompt: int, batch: int = 1
) -> int:
    """The largest forward of a generating notebook: the largest tree verified on the longest cache
    (`batch` rows), the prefill of the longest prompt (logits of its last token), or the perplexity
    score of prompt + output, one sequence without a cache (float32 copies of the output's rows)."""
    return max(
        forward_bytes(config, nodes + 1, cache, dtype_bytes, batch=batch),
        forward_bytes(config, prompt, 0, dtype_bytes, logits_rows=1, batch=batch),
        forward_bytes(config, prompt + new, 0, dtype_bytes, float_rows=new),
    )


def _super_tree_bytes(draft: _Model, target: _Model, size: int, k: int, depth: int, cache: int, db: int) -> int:
    """SUPER_CHUNK positions, one node each, fed in one draft forward per round (best first,
    `experiments.collect`), and the draft's cache growing by every fed node (at most `size` per
    position). An unsized draft is sized as the target (an upper bound)."""
    if k < 1 or depth < 2 or size < 1:
        return 0
    rows = SUPER_CHUNK
    fed = SUPER_CHUNK * size
    model = draft if draft.config is not None else target
    return forward_bytes(model.config, rows, cache + fed, db) + model.kv(fed, db)


def _replay_bytes(positions: int, new: int, vocab: int, nodes: int, top_k: int, sequoia: bool = False) -> int:
    """A collection's ranks and one replay (module docstring, "arrays"): log q [L + 1, V] float32
    twice, ranks [L, K + 1] (int64 top, float32 gaps, bool hits), the child table [N + 1, K + 1]
    int64, REPLAY_COPIES [positions, N] arrays, and Sequoia's two [K + 1, N + 1] tables."""
    ranked = min(top_k + 1, vocab) if vocab else top_k + 1
    out = (new + 1) * vocab * FLOAT32 * 2 + new * ranked * (8 + 4 + 1)
    out += (nodes + 1) * (top_k + 1) * 8 + REPLAY_COPIES * positions * nodes * 8
    return out + (2 * (top_k + 1) * (nodes + 1) * 8 if sequoia else 0)


def _grid_bytes(p: Mapping[str, Any], target: _Model, custom: Mapping[str, Tree], notes: list[str]) -> int:
    """03's largest grid point: q and the output [B, H, M, D], k and v [B, Hkv, P + M, D] in the
    grid's dtype, the eager reference's float32 scores [B, H, M, P + M]."""
    shape = p.get("attention_shape") or ""
    if isinstance(shape, str) and shape.strip().startswith("{"):
        try:
            shape = json.loads(shape)
        except ValueError:
            notes.append(f"attention_shape {shape!r} is not JSON: the grid is not counted")
            return 0
    if isinstance(shape, Mapping):
        heads, kv_heads, head_dim = shape["heads"], shape.get("kv_heads", shape["heads"]), shape["head_dim"]
    else:
        heads, kv_heads, head_dim, _, _ = _shape(_load(shape, notes=notes).config if shape else target.config)
    size = 2 if p.get("dtype") in ("float16", "bfloat16") else FLOAT32
    b, prefix = max(_ints(p, "batches"), default=0), max(_ints(p, "prefixes"), default=0)
    m = max(_ints(p, "nodes") + [t.num_nodes for t in custom.values()], default=0)
    return attention_grid_bytes(b, heads, kv_heads, head_dim, prefix, m, size)


@dataclass(frozen=True)
class _Setting:
    """What every part of one notebook's estimate shares."""

    notebook: str
    device: str
    dtype: str
    notes: list[str]  # filled while sizing; frozen into RunMemory.notes

    @property
    def db(self) -> int:
        return DTYPE_BYTES.get(self.dtype, FLOAT32)  # another dtype name: counted as float32

    def pair(self, p: Mapping[str, Any]) -> tuple[_Model, _Model]:
        target = _load(p.get("target") or "", p.get("target_quantization"), None, self.notes)
        draft = _load(p.get("draft") or "", p.get("draft_quantization"), p.get("draft_layers"), self.notes)
        return target, draft

    def memory(self, **parts: int) -> RunMemory:
        return RunMemory(
            self.notebook, self.device, self.dtype, runtime=RUNTIME[self.device], notes=tuple(self.notes), **parts
        )


def _tree_shapes(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """01: the pair, a collection with super-trees, every shape and budget replayed, Sequoia's trees
    designed at the largest budget, the verify-cost curve, methods checked end to end."""
    target, draft = s.pair(p)
    custom = _custom_trees(p.get("custom_trees"), notes=s.notes)
    new = _int(p, "max_new_tokens")
    cache = max(LONGEST_PROMPT + new, _int(p, "verify_prefix"))
    static = _tree_sizes(p.get("shapes") or [], _ints(p, "budgets"), [], custom)
    run = _tree_sizes([], [], [*(p.get("check_methods") or []), "chain:4"], custom)
    size = max(_ints(p, "dynamic_budgets"), default=1)
    nodes = max([t.nodes for t in static + run] + _ints(p, "dynamic_budgets") + _ints(p, "verify_nodes"), default=0)
    k = _int(p, "super_k")
    top_k = max([t.widest + 1 for t in static] + [k, _int(p, "top_k")])
    vocab = target.vocab or draft.vocab
    replayed = max([t.nodes for t in static] + [size])
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
        verify=_verify(target.config, nodes, cache, new, s.db, LONGEST_PROMPT),
        continuations=_continuations(p, target, s),
        super_trees=_super_tree_bytes(draft, target, size, k, _int(p, "super_depth"), cache, s.db),
        arrays=_replay_bytes(_int(p, "max_prompts") * new, new, vocab, replayed, top_k, sequoia=True),
    )


def _continuations(p: Mapping[str, Any], target: _Model, s: _Setting) -> int:
    """The target decoding `batch` prompts' continuations together (`experiments.continuations`): their
    caches, and the forward that prefills them (rows of similar length together: the longest at worst)."""
    batch = min(_int(p, "batch", 1), _int(p, "max_prompts", 1))
    cache = batch * target.kv(LONGEST_PROMPT + _int(p, "max_new_tokens") + 1, s.db)
    return cache + forward_bytes(target.config, LONGEST_PROMPT, 0, s.db, logits_rows=1, batch=batch)


def _model_pairs(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """02: every pair in turn, with the models held for later pairs (`experiments.sweeps.run_pairs`),
    its methods and, with `grid`, its collection (super-trees) and every shape x budget replayed and
    designed (`experiments.grid`); the largest pair is the estimate (a note names it)."""
    new = _int(p, "max_new_tokens")
    cache = LONGEST_PROMPT + new
    pairs = [q for q in p.get("pairs") or [] if isinstance(q, Mapping)]
    keys = [
        (
            (q.get("target") or "", q.get("target_quantization"), None),
            (q.get("draft") or "", q.get("draft_quantization"), q.get("draft_layers")),
        )
        for q in pairs
    ]
    models = {key: _load(*key, notes=s.notes) for pair in keys for key in pair}
    held: set[tuple] = set()
    candidates = []
    for i, (q, (target_key, draft_key)) in enumerate(zip(pairs, keys)):
        held = {key for key in held if key in {k for later in keys[i:] for k in later}} | {target_key, draft_key}
        target, draft = models[target_key], models[draft_key]
        custom = _custom_trees(p.get("custom_trees"), q.get("custom_trees"), notes=s.notes)
        trees = _tree_sizes([], [], [*(q.get("methods") or p.get("methods") or []), *(p.get("measure") or [])], custom)
        grid = _tree_sizes(p.get("shapes") or [], _ints(p, "budgets"), [], custom) if p.get("grid") else []
        nodes = max((t.nodes for t in trees + grid), default=0)
        dynamic = max((t.nodes for t in trees if t.shape == DYNAMIC), default=0) if p.get("replay", True) else 0
        dynamic = max([dynamic, *(_ints(p, "dynamic_budgets") if grid else [])])
        k, depth = (_int(p, "super_k"), _int(p, "super_depth")) if grid else (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH)
        top_k = max([t.widest + 1 for t in trees + grid] + [COLLECTION_TOP_K, _int(p, "top_k") if grid else 0])
        parts = dict(
            weights=sum(models[key].weights(s.db) for key in held),
            kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
            verify=_verify(target.config, nodes, cache, new, s.db, LONGEST_PROMPT),
            continuations=_continuations(p, target, s) if grid else 0,
            super_trees=_super_tree_bytes(draft, target, dynamic, max(k, DYNAMIC_TOP_K), depth, cache, s.db),
            arrays=_replay_bytes(
                _int(p, "max_prompts") * new, new, target.vocab or draft.vocab, nodes, top_k, sequoia=bool(grid)
            ),
        )
        label = f"largest: pair {i + 1} of {len(pairs)}, {draft.name} -> {target.name}, {len(held)} models held"
        candidates.append((sum(parts.values()), label, parts))
    if not candidates:
        return s.memory()
    _, label, parts = max(candidates, key=lambda c: c[0])
    s.notes.insert(0, label)
    return s.memory(**parts)


def _attention_timing(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """03: the attention grid (no model loaded), then the verify-cost curve of the pair on a cache of
    verify_prefix tokens (the draft's forward up to the widest level, at most the largest tree)."""
    target, draft = s.pair(p)
    custom = _custom_trees(p.get("custom_trees"), notes=s.notes)
    cache = _int(p, "verify_prefix")
    nodes = max(_ints(p, "verify_nodes") + [t.num_nodes for t in custom.values()], default=0)
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
        verify=max(
            forward_bytes(target.config, nodes + 1, cache, s.db), forward_bytes(draft.config, nodes, cache, s.db)
        ),
        grid=_grid_bytes(p, target, custom, s.notes),
    )


def _long_generation(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """04 (and a notebook without a rule of its own): the pair, the full cache (window 0) of the
    longest generation, its largest tree and the perplexity score of its output."""
    target, draft = s.pair(p)
    custom = _custom_trees(p.get("custom_trees"), notes=s.notes)
    new = _int(p, "max_new_tokens")
    cache = LONGEST_PROMPT + new
    nodes = max((t.nodes for t in _tree_sizes([], [], p.get("methods") or [], custom)), default=0)
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db),
        verify=_verify(target.config, nodes, cache, new, s.db, LONGEST_PROMPT),
    )


def _batch_size(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """06: the largest batch's caches (prompts of at most max_prompt_tokens), its verify forward over
    the largest tree in every row, the replayed collection of its prompts."""
    target, draft = s.pair(p)
    custom = _custom_trees(p.get("custom_trees"), notes=s.notes)
    new, batch = _int(p, "max_new_tokens"), max(_ints(p, "batches"), default=1)
    prompt = min(LONGEST_PROMPT, _int(p, "max_prompt_tokens", LONGEST_PROMPT))
    cache = prompt + new
    trees = _tree_sizes(p.get("shapes") or [], _ints(p, "budgets"), [f"chain:{_int(p, 'k', 1)}"], custom)
    nodes = max((t.nodes for t in trees), default=0)
    top_k = max([t.widest + 1 for t in trees] + [COLLECTION_TOP_K])
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db),
        kv_cache=batch * (target.kv(cache + 1 + nodes, s.db) + draft.kv(cache + 1 + nodes, s.db)),
        verify=_verify(target.config, nodes, cache, new, s.db, prompt, batch),
        arrays=_replay_bytes(_int(p, "max_prompts") * new, new, target.vocab or draft.vocab, nodes, top_k),
    )


def _learned_drafters(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """05: the pair and the Medusa and EAGLE heads (`_head_bytes`); where a head is trained, the
    distillation batches (gen_batch rows of prompt + distill_tokens, `samples` sampled rows more for
    each) and the training step;
    the heads' super-trees (EAGLE-2's trees re-drafted) and replays of every drafter's trees."""
    target, draft = s.pair(p)
    custom = _custom_trees(p.get("custom_trees"), notes=s.notes)
    new, distill = _int(p, "max_new_tokens"), _int(p, "distill_tokens")
    prompt = min(LONGEST_PROMPT, _int(p, "max_prompt_tokens", LONGEST_PROMPT))
    rows = max(_int(p, "gen_batch", 1), 1) * (1 + _int(p, "samples"))
    budgets = _ints(p, "budgets")
    nodes = max(budgets + [_int(p, "speed_budget")] + [t.num_nodes for t in custom.values()], default=0)
    _, _, _, hidden, intermediate = _shape(target.config)
    vocab = target.vocab
    training, trains = 0, "train" in (p.get("heads"), p.get("eagle_heads"))
    if trains:
        kept = _int(p, "train_prompts") * (1 + _int(p, "samples")) * (distill + (prompt if p.get("prompt_rows") else 0))
        batch, num_heads = _int(p, "batch_size"), _int(p, "num_heads")
        loss_vocab = vocab if p.get("loss_vocab") == "full" else min(vocab, batch * num_heads + MEDUSA_NEGATIVES)
        medusa = batch * num_heads * loss_vocab * FLOAT32 * (SOFTMAX_COPIES + 1) if p.get("heads") == "train" else 0
        eagle_rows = _int(p, "eagle_batch_rows")
        ce_rows = _int(p, "eagle_ce_rows") or eagle_rows
        eagle = (
            eagle_rows * (6 * hidden + 3 * intermediate) * FLOAT32 * 2
            + ce_rows * vocab * FLOAT32 * (SOFTMAX_COPIES + 1)
            if p.get("eagle_heads") == "train"
            else 0
        )
        training = kept * hidden * FLOAT32 + max(medusa, eagle)
    size = max(budgets, default=1)
    return s.memory(
        weights=target.weights(s.db) + draft.weights(s.db) + _head_bytes(p, target, s.db, s.notes),
        kv_cache=max(
            target.kv(prompt + new + 1 + nodes, s.db) + draft.kv(prompt + new + 1 + nodes, s.db),
            rows * target.kv(prompt + distill, s.db) if trains else 0,
        ),
        verify=max(
            _verify(target.config, nodes, prompt + new, new, s.db, prompt),
            forward_bytes(target.config, prompt + distill, 0, s.db, logits_rows=1, batch=rows) if trains else 0,
        ),
        super_trees=_super_tree_bytes(
            draft, target, size, _int(p, "dynamic_top_k"), _int(p, "eagle_depth"), prompt + new, s.db
        ),
        arrays=_replay_bytes(_int(p, "test_prompts") * new, new, vocab, nodes, max(nodes, COLLECTION_TOP_K), True),
        training=training,
    )


def _head_bytes(p: Mapping[str, Any], target: _Model, dtype_bytes: int, notes: list[str]) -> int:
    """05's Medusa and EAGLE heads: trained (float32, ADAM_COPIES), random stand-ins (model dtype), or
    a published checkpoint (`io.checkpoints`); a folder or an unknown id: not counted, said so."""
    heads, kv_heads, head_dim, hidden, intermediate = _shape(target.config)
    vocab = target.vocab
    medusa, eagle = p.get("heads") or "", p.get("eagle_heads") or ""
    out = 0
    if medusa in ("train", "standin"):
        own_head = 0 if p.get("share_lm_head", True) and medusa == "train" else vocab * hidden
        blocks = _int(p, "num_heads") * (max(_int(p, "head_layers", 1), 1) * (hidden * hidden + hidden) + own_head)
        out += blocks * (FLOAT32 * ADAM_COPIES if medusa == "train" else dtype_bytes)
    if eagle in ("train", "standin"):
        layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate + hidden
        size = 2 * hidden * hidden + hidden + layer
        out += size * (FLOAT32 * ADAM_COPIES if eagle == "train" else dtype_bytes)
    published = published_checkpoints()
    for name in (medusa, eagle):
        if name in ("train", "standin", ""):
            continue
        checkpoint = published.get(name)
        if isinstance(checkpoint, PublishedHeads):
            out += medusa_heads_bytes(hidden, vocab, checkpoint.num_heads, checkpoint.num_layers, dtype_bytes)
        elif isinstance(checkpoint, PublishedEagle):
            out += eagle_head_bytes(checkpoint, dtype_bytes)
        else:
            notes.append(f"heads {name}: not a published checkpoint specnb knows, not counted")
    return out


def _report(s: _Setting, p: Mapping[str, Any]) -> RunMemory:
    """07: no model, only the runs' tables and figures (the interpreter's runtime)."""
    return s.memory()


RULES = {  # a notebook's spec names its rule (`registry.NotebookSpec.memory`)
    "tree_shapes": _tree_shapes,
    "model_pairs": _model_pairs,
    "attention_timing": _attention_timing,
    "generation": _long_generation,
    "learned_drafters": _learned_drafters,
    "batch_size": _batch_size,
    "none": _report,
}


def estimate_run(
    notebook: str, params: Mapping[str, Any], device: str | None = None, folder: Path = NOTEBOOKS
) -> RunMemory:
    """The estimate for one notebook (its stem) from its resolved parameters, by the rule its spec
    names (`registry`; a notebook in `folder` without a spec, or naming no known rule: its models,
    caches and one forward, and a note says so). device: "cpu" or "cuda" (None: this machine's, CUDA
    where torch sees it)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = params.get("model_dtype") or ("float16" if device == "cuda" else "float32")
    setting = _Setting(notebook, device, dtype, [])
    rule = registry.spec(notebook, folder).memory
    if rule not in RULES:
        setting.notes.append(f"no memory rule {rule!r} (have {sorted(RULES)}): its models, caches and one forward")
    elif not registry.spec(notebook, folder).declared:
        setting.notes.append("no spec in its metadata: its models, caches and one forward only")
    return RULES.get(rule, _long_generation)(setting, params)


# ---- this machine and the check ----------------------------------------------------------------


def available_bytes() -> tuple[int, str]:
    """(bytes, where the number comes from): CUDA device 0's total memory where torch sees CUDA, else
    MemAvailable of /proc/meminfo, else psutil's available memory, else a very large number, unknown."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return int(props.total_memory), f"total memory of CUDA device 0, {props.name}"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return 1 << 62, "unknown: no /proc/meminfo and no psutil, so nothing is refused"
    return int(psutil.virtual_memory().available), "available memory, psutil"


def check_run_memory(
    resolved: Mapping[str, Mapping[str, Any]], available: tuple[int, str] | None = None, folder: Path = NOTEBOOKS
) -> None:
    """ParameterError, before any model loads, naming every notebook of `resolved` (stem -> its
    parameters) whose estimate exceeds `available` (default `available_bytes()`): the estimate with
    its parts in GB, what this machine has, and the parameters that size its largest parts."""
    limit, where = available or available_bytes()
    refused = [m for m in (estimate_run(nb, p, folder=folder) for nb, p in resolved.items()) if m.total > limit]
    if refused:
        raise ParameterError("\n".join(refusal(m, limit, where, folder) for m in refused))


def refusal(memory: RunMemory, limit: int, where: str, folder: Path = NOTEBOOKS) -> str:
    """Why `memory` does not fit in `limit` bytes, and the parameters that size its largest parts (its
    spec's `lower`: up to three, each at least 5% of the total)."""
    lower = registry.spec(memory.notebook, folder).lower
    parts = memory.parts()
    largest = sorted(((v, k) for k, v in parts.items() if k in lower and v >= 0.05 * memory.total), reverse=True)[:3]
    advice = "; ".join(f"{PART_NAMES[k]} {gb(v)} GB: {', '.join(lower[k])}" for v, k in largest)
    return (
        f"{memory.describe()}\n  does not fit: this machine has {gb(limit)} GB ({where}); nothing was started. "
        f"Lower the parameters that size the largest parts ({advice})."
    )
