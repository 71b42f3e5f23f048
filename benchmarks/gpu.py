"""The GPU check: in one process, what only a GPU shows (issue 36), within about 5 minutes on an H100.

    benchmarks/gpu.sh OUT_DIR                  on a CUDA machine with no network: installs the carried
                                               wheels (.whl/), then runs this script
    python benchmarks/gpu.py --out DIR --dry   the CPU rehearsal: the same code at tiny sizes, float32
                                               (tests/test_gpu_check.py runs it)

Parts, in this order; each has a time budget, is guarded (a part that fails is recorded with its
error and the others still run) and writes its file as soon as it ends:
    exactness   greedy speculative output against the target's plain greedy output, float16, on the
                dry run's stand-in pairs (`notebook.dryrun`: Llama-160M -> Llama-2-7B and Llama-3.2-1B
                -> Llama-3.2-3B at stand-in size, seeded weights) and on Llama-2-7B at its real shape
                (seeded random weights) drafted by an identical copy of itself, so that drafts are
                accepted and the one-row (decode) and many-row (verify) kernels of a 7B-sized model
                meet at every step; random prompts, three trees; every divergence classified exact /
                tie / mismatch (`analysis.quality`)
    sampling    lossless sampling: the first two tokens of N sampled speculative runs of a tiny model
                (vocabulary 7) against the target's exact distribution, chi-square p-value
    attention   notebook 03's grid at the t4 profile's sizes: Llama-2-7B's 32 heads x 128, float16,
                eager / per-sequence / SDPA with the tree mask / FlexAttention with a BlockMask /
                plain causal, batch 1, 4, 16, prefix 256, 1024, 4096, 4 to 64 nodes (`bench.attention_grid`),
                each implementation checked against eager at the largest points; FlexAttention with
                the kernel options a small-shared-memory GPU (the T4) gets, checked too
    curves      the verify-cost curve of random-weight float16 models with the real configs of
                Llama-2-7B and Llama-3.2-3B (targets: verify and plain forward) and Llama-160M and
                Llama-3.2-1B (drafts: one forward per level width), 0 to 64 nodes, caches of 256 and
                1024 tokens, batch 1 (`bench.verify_curve`) and 4 (`bench.batch_curve`); then the
                targets again with their decoder's linear layers in bitsandbytes nf4 (the t4 profile's
                4-bit weights; model names end in "-nf4"), where bitsandbytes is installed. Timing
                does not depend on the weights' values, only on shapes and dtype
    cost        the cost model's best budget per shape (`analysis.cost_model`) from those curves (float16
                targets and, where measured, nf4 ones; drafts in float16) and
                the acceptance vectors in benchmarks/gpu_acceptance.json: measured by notebook 01 on
                a CPU for another pair, so labelled as borrowed in every row

Files in --out (flat, at most 8: what the device tool brings back): summary.md (the tables a
closing note quotes), summary.json, exactness.csv, attention.csv, attention_check.csv, curves.csv,
cost.csv.

The GPU image has torch 2.11 with CUDA, triton and transformers 5.17, below specnb's floor (5.24):
benchmarks/requirements-gpu.txt names the wheels that travel, downloaded here with
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl -r benchmarks/requirements-gpu.txt
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
import transformers
from scipy import stats
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from specnb.analysis import cost_model, quality
from specnb.bench import attention, attention_grid, batch_curve, verify_curve
from specnb.core.generation import autoregressive_generate, speculative_generate
from specnb.core.sampling import SamplingConfig
from specnb.core.trees import Tree
from specnb.io.model_configs import config_of, hub_model
from specnb.io.storage import Sweep
from specnb.notebook import dryrun

HERE = Path(__file__).resolve().parent
ACCEPTANCE_FILE = HERE / "gpu_acceptance.json"
TARGETS = {"llama-2-7b": "meta-llama/Llama-2-7b-hf", "llama-3.2-3b": "meta-llama/Llama-3.2-3B"}
DRAFTS = {"llama-160m": "JackFram/llama-160m", "llama-3.2-1b": "meta-llama/Llama-3.2-1B"}
PAIRS = (("llama-160m", "llama-2-7b"), ("llama-3.2-1b", "llama-3.2-3b"))  # (draft, target), one vocabulary each
SELF_DRAFTED = "llama-2-7b"  # exactness at a real shape: this target drafted by an identical copy of itself
NF4 = "-nf4"  # suffix of a target's name in curves.csv when its linear layers are nf4
COST_SHAPES = ("chain", "kary2", "sparse")


@dataclass(frozen=True)
class Sizes:
    """What each part runs; `FULL` on a GPU, `DRY` for the CPU rehearsal."""

    device: str
    dtype: torch.dtype
    real_shapes: bool  # the models' real configs (False: stand-in sizes, for the rehearsal)
    exact_prompts: int
    exact_new_tokens: int
    exact_trees: tuple[str, ...]  # "shape:nodes" (`Tree.preset`)
    sampling_runs: int
    grid_batches: tuple[int, ...]
    grid_prefixes: tuple[int, ...]
    grid_nodes: tuple[int, ...]
    grid_impls: tuple[str, ...]
    grid_warmup: int
    grid_repeats: int
    curve_prefixes: tuple[int, ...]
    curve_nodes: tuple[int, ...]
    curve_batches: tuple[int, ...]
    curve_repeats: int
    budgets_s: dict[str, float] = field(default_factory=dict)  # per part: stop starting new work after
    acceptance_file: Path = ACCEPTANCE_FILE  # the acceptance vectors the cost model borrows


FULL = Sizes(
    device="cuda",
    dtype=torch.float16,
    real_shapes=True,
    exact_prompts=8,
    exact_new_tokens=48,
    exact_trees=("chain:4", "kary2:8", "sparse:16"),
    sampling_runs=2000,
    grid_batches=(1, 4, 16),
    grid_prefixes=(256, 1024, 4096),
    grid_nodes=(4, 8, 16, 32, 64),
    grid_impls=attention.IMPLEMENTATIONS + (attention.CAUSAL,),
    grid_warmup=3,
    grid_repeats=10,
    curve_prefixes=(256, 1024),
    curve_nodes=(0, 1, 2, 4, 8, 16, 32, 64),
    curve_batches=(1, 4),
    curve_repeats=20,
    budgets_s={"exactness": 150, "sampling": 45, "attention": 120, "curves": 240, "cost": 10},
)
DRY = replace(
    FULL,
    device="cpu",
    dtype=torch.float32,
    real_shapes=False,
    exact_prompts=2,
    exact_new_tokens=8,
    sampling_runs=400,
    grid_batches=(1, 2),
    grid_prefixes=(16,),
    grid_nodes=(4, 8),
    grid_impls=("sdpa", "per_sequence", "eager", attention.CAUSAL),  # FlexAttention's CPU compile takes minutes
    grid_warmup=1,
    grid_repeats=2,
    curve_prefixes=(16,),
    curve_nodes=(0, 2, 4),
    curve_batches=(1, 2),
    curve_repeats=2,
    budgets_s={"exactness": 60, "sampling": 60, "attention": 60, "curves": 60, "cost": 20},
)


class Report:
    """The parts' outcomes, times and headline numbers; writes summary.json and summary.md."""

    def __init__(self, out: Path, sizes: Sizes) -> None:
        self.out, self.sizes = out, sizes
        self.parts: dict[str, dict] = {}
        self.tables: dict[str, str] = {}  # part -> markdown
        self.env = environment(sizes)

    def run(self, name: str, part: Callable[[Sizes, Path, float], tuple[dict, str]]) -> None:
        start = time.perf_counter()
        deadline = start + self.sizes.budgets_s.get(name, 60)
        print(f"== {name}", flush=True)
        try:
            headline, table = part(self.sizes, self.out, deadline)
            self.parts[name] = {"status": "ok", **headline}
            self.tables[name] = table
        except Exception as e:  # a broken part must not cost the others their minutes
            traceback.print_exc()
            self.parts[name] = {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:500]}"}
        self.parts[name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"== {name}: {self.parts[name]['status']} in {self.parts[name]['seconds']} s", flush=True)
        self.write()

    def write(self) -> None:
        (self.out / "summary.json").write_text(json.dumps({"environment": self.env, "parts": self.parts}, indent=1))
        lines = [f"# GPU check, {self.env['when']}", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self.env.items()]
        for name, part in self.parts.items():
            lines += ["", f"## {name}: {part['status']} in {part['seconds']} s"]
            lines += [f"- {k}: {v}" for k, v in part.items() if k not in ("status", "seconds")]
            if name in self.tables:
                lines += ["", self.tables[name]]
        (self.out / "summary.md").write_text("\n".join(lines) + "\n")


def environment(sizes: Sizes) -> dict[str, str]:
    env = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "mode": "GPU" if sizes.device == "cuda" else "dry (CPU rehearsal, tiny sizes)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": attention_grid_device(sizes.device),
    }
    if sizes.device == "cuda":
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["memory_gib"] = f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f}"
    return env


def attention_grid_device(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"


def markdown(frame: pd.DataFrame, digits: int = 3) -> str:
    """A small table as markdown, without the optional tabulate package."""
    if frame.empty:
        return "(no rows)"
    cells = frame.astype(object).map(lambda v: f"{v:.{digits}g}" if isinstance(v, float) else str(v))
    rows = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(rows + ["| " + " | ".join(r) + " |" for r in cells.to_numpy().tolist()])


# ---- exactness ---------------------------------------------------------------------------------


def standin_model(hub_id: str, sizes: Sizes) -> torch.nn.Module:
    """The dry run's stand-in of `hub_id` (its real vocabulary, seeded weights), on the device."""
    model = AutoModelForCausalLM.from_config(dryrun.standin_config(hub_model(hub_id)))
    dryrun.standin_weights(model, hub_id, hub_model(hub_id).tokenizer.family)
    return model.to(sizes.device, sizes.dtype).eval()


def exact_pairs(sizes: Sizes) -> list[tuple[str, Callable[[], tuple[torch.nn.Module, torch.nn.Module]]]]:
    """(label, build) per pair the exactness part runs; build gives (target, draft) on the device."""
    pairs = [
        (
            f"{d} -> {t} (stand-ins)",
            lambda d=d, t=t: (standin_model(TARGETS[t], sizes), standin_model(DRAFTS[d], sizes)),
        )
        for d, t in PAIRS
    ]
    shape = "real shape" if sizes.real_shapes else "stand-in shape"
    hub_id = TARGETS[SELF_DRAFTED]
    pairs.append(
        (
            f"{SELF_DRAFTED} -> itself ({shape}, random weights)",
            lambda: (random_model(hub_id, sizes), random_model(hub_id, sizes)),  # same seed: identical copies
        )
    )
    return pairs


def exactness(sizes: Sizes, out: Path, deadline: float) -> tuple[dict, str]:
    rows = []
    start = time.perf_counter()
    pairs = exact_pairs(sizes)
    for i, (label, build) in enumerate(pairs):
        share = start + (deadline - start) * (i + 1) / len(pairs)  # each pair its share of the budget
        target, draft = build()
        g = torch.Generator().manual_seed(0)
        for p in range(sizes.exact_prompts):
            if time.perf_counter() > share:
                break
            length = int(torch.randint(16, 65, (1,), generator=g))
            prompt = torch.randint(3, target.config.vocab_size, (1, length), generator=g).to(sizes.device)
            plain = autoregressive_generate(target, prompt, sizes.exact_new_tokens, eos_token_id=()).tokens.cpu()
            margins = quality.score(target, prompt, plain).margins
            gap = quality.logit_gap(target, prompt, plain[:8])
            for spec in sizes.exact_trees:
                tree = Tree.preset(*_shape_nodes(spec))
                r = speculative_generate(target, draft, prompt, tree, sizes.exact_new_tokens, eos_token_id=())
                eq = quality.compare_greedy(r.tokens.cpu(), plain, margins, sizes.dtype, gap)
                rows.append(
                    {
                        "pair": label,
                        "prompt": p,
                        "prompt_tokens": length,
                        "tree": spec,
                        "verdict": eq.verdict,
                        "position": eq.position,
                        "margin": eq.margin,
                        "threshold": eq.threshold,
                        "logit_gap": gap,
                        "tau": len(r.tokens) / len(r.steps),
                    }
                )
        del target, draft
        if sizes.device == "cuda":
            torch.cuda.empty_cache()
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "exactness.csv", index=False)
    counts = frame.groupby(["pair", "tree"])["verdict"].value_counts().unstack(fill_value=0).reset_index()
    headline = {v: int((frame["verdict"] == v).sum()) for v in quality.VERDICTS}
    headline["max_logit_gap"] = float(frame["logit_gap"].max())
    return headline, markdown(counts)


def _shape_nodes(spec: str) -> tuple[str, int]:
    shape, nodes = spec.split(":")
    return shape, int(nodes)


# ---- lossless sampling -------------------------------------------------------------------------


def tiny_pair(sizes: Sizes) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Target and draft over 7 tokens, logits scaled 4x (peaked enough that drafts are often right)."""
    models = []
    for seed in (20, 21):
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=7,
            hidden_size=16,
            intermediate_size=36,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.mul_(4.0)
        models.append(model.to(sizes.device).eval())  # float32: the exact distribution is the reference
    return models[0], models[1]


@torch.inference_mode()
def first_two_exact(target: torch.nn.Module, prompt: torch.Tensor) -> dict[tuple[int, int], float]:
    vocab = target.config.vocab_size
    first = torch.softmax(target(prompt).logits[0, -1].double(), -1)
    exact = {}
    for a in range(vocab):
        nxt = torch.cat([prompt, torch.tensor([[a]], device=prompt.device)], 1)
        second = torch.softmax(target(nxt).logits[0, -1].double(), -1)
        exact.update({(a, b): float(first[a] * second[b]) for b in range(vocab)})
    return exact


def sampling(sizes: Sizes, out: Path, deadline: float) -> tuple[dict, str]:
    target, draft = tiny_pair(sizes)
    prompt = torch.tensor([[3, 5, 4]], device=sizes.device)
    exact = first_two_exact(target, prompt)
    samples = []
    for seed in range(sizes.sampling_runs):
        if time.perf_counter() > deadline:
            break
        r = speculative_generate(
            target, draft, prompt, Tree.kary(2, 6), 3, SamplingConfig(temperature=1.0, seed=seed), eos_token_id=()
        )
        samples.append(tuple(r.tokens[:2].tolist()))
    p = chi_square_pvalue(samples, exact)
    headline = {"runs": len(samples), "cells": len(exact), "p_value": p, "tree": "kary2 of 6 nodes", "dtype": "float32"}
    return (
        headline,
        f"chi-square of the first two tokens, {len(samples)} runs: p = {p:.3g} (a broken rule gives p < 1e-3)",
    )


def chi_square_pvalue(samples: list, expected: dict) -> float:
    """p-value of the samples against the exact distribution; cells expected below 5 pooled into one."""
    n, counts = len(samples), Counter(samples)
    if set(counts) - {c for c, pr in expected.items() if pr > 0}:
        return 0.0  # an impossible cell was sampled
    big = [c for c, pr in expected.items() if pr * n >= 5]
    small = [c for c, pr in expected.items() if pr * n < 5]
    if len(big) < 2:
        raise ValueError(f"{n} runs are too few for a chi-square over {len(expected)} cells")
    observed = [counts.get(c, 0) for c in big] + ([sum(counts.get(c, 0) for c in small)] if small else [])
    wanted = [expected[c] * n for c in big] + ([sum(expected[c] for c in small) * n] if small else [])
    wanted = [w * n / sum(wanted) for w in wanted]
    return float(stats.chisquare(observed, wanted).pvalue)


# ---- tree attention ----------------------------------------------------------------------------


def head_shape(sizes: Sizes) -> attention_grid.HeadShape:
    config = config_of(TARGETS["llama-2-7b"])
    if not sizes.real_shapes:
        config = dryrun.standin_config(hub_model(TARGETS["llama-2-7b"]))
    return attention_grid.HeadShape.from_config(config, "llama-2-7b" + ("" if sizes.real_shapes else " (stand-in)"))


def attention_part(sizes: Sizes, out: Path, deadline: float) -> tuple[dict, str]:
    heads = head_shape(sizes)
    points = attention_grid.grid(sizes.grid_batches, sizes.grid_prefixes, sizes.grid_nodes, ["sparse"])
    config = attention_grid.GridConfig(
        impls=sizes.grid_impls,
        dtype=sizes.dtype,
        device=sizes.device,
        warmup=sizes.grid_warmup,
        repeats=sizes.grid_repeats,
        progress=False,
    )
    checks = attention_checks(sizes, heads, points)
    pd.DataFrame(checks).to_csv(out / "attention_check.csv", index=False)
    with tempfile.TemporaryDirectory() as tmp:
        store = Sweep(Path(tmp) / "grid.jsonl", attention_grid.GRID_KEY)
        for point in points:  # cheapest first: a deadline leaves the small points
            if time.perf_counter() > deadline:
                break
            attention_grid.run_grid(store, [point], heads, config)
            config = drop_skipped(store, config)
        table = attention_grid.grid_table(store)
    table.to_csv(out / "attention.csv", index=False)
    speed = attention_grid.speedup_table(table)
    if {"flex", "sdpa"} <= set(speed.columns):
        speed["flex_over_sdpa"] = speed["flex"] / speed["sdpa"]
    cols = [
        c
        for c in ("batch", "prefix", "nodes", "per_sequence_over_tree", "mask_overhead", "flex_over_sdpa")
        if c in speed
    ]
    headline = {
        "heads": f"{heads.heads} x {heads.head_dim} ({heads.kv_heads} kv)",
        "points": f"{len(speed)} of {len(points)}",
        "checks_failed": sum(1 for c in checks if c["ok"] is False),
    }
    for col in cols[3:]:
        headline[f"{col} (median over points)"] = float(speed[col].median())
    return headline, markdown(speed[cols])


def drop_skipped(store: Sweep, config: attention_grid.GridConfig) -> attention_grid.GridConfig:
    """An implementation skipped at one point (it cannot run here) is not tried again."""
    rows = store.frame()
    skipped = set(rows.loc[rows["status"] == "skipped", "impl"]) if not rows.empty else set()
    return replace(config, impls=tuple(i for i in config.impls if i not in skipped))


def attention_checks(sizes: Sizes, heads: attention_grid.HeadShape, points: list) -> list[dict]:
    """Every implementation against eager at the largest point of each batch size, and FlexAttention
    with the small-shared-memory kernel options (the T4's) on this GPU."""
    rows = []
    largest = {p.batch: p for p in points}  # points are sorted cheapest first
    impls = tuple(i for i in sizes.grid_impls if i != attention.CAUSAL)
    for point in largest.values():
        x = attention.random_inputs(
            point.tree_batch(True), heads.heads, heads.head_dim, heads.kv_heads, sizes.dtype, sizes.device, seed=1
        )
        for row in attention.check_against_reference(x, impls):
            rows.append({**point.key(), **row})
        if sizes.device == "cuda":
            rows.append({**point.key(), **t4_flex_check(x)})
    return rows


def t4_flex_check(x: attention.AttentionInputs) -> dict:
    """FlexAttention with the T4's kernel options (`attention.flex_kernel_options` at capability 7.5)."""
    from torch.nn.attention.flex_attention import flex_attention

    options = {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4}
    try:
        kernel = torch.compile(flex_attention, dynamic=True)
        mask = attention.block_mask(x.batch, x.q.device)
        out = kernel(x.q, x.k, x.v, block_mask=mask, enable_gqa=x.gqa, kernel_options=options)
        err = attention.max_abs_error(out, attention.tree_attention(x, attention.REFERENCE), x.batch)
        tol = attention.TOLERANCE[x.q.dtype]
        return {
            "impl": "flex (T4 kernel options)",
            "max_abs_error": err,
            "tolerance": tol,
            "ok": err <= tol,
            "note": str(options),
        }
    except Exception as e:
        return {
            "impl": "flex (T4 kernel options)",
            "max_abs_error": math.nan,
            "ok": False,
            "note": f"{type(e).__name__}: {e}"[:300],
        }


# ---- verify-cost curves and the cost model -----------------------------------------------------


def random_model(hub_id: str, sizes: Sizes) -> torch.nn.Module:
    """A model of `hub_id`'s real config (or its stand-in size) with seeded random weights, built on the device."""
    config = config_of(hub_id) if sizes.real_shapes else dryrun.standin_config(hub_model(hub_id))
    torch.manual_seed(0)
    with torch.device(sizes.device):
        model = AutoModelForCausalLM.from_config(config, dtype=sizes.dtype)
    return model.eval()


def quantize_nf4(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each decoder Linear replaced, in place, by bitsandbytes' nf4 `Linear4bit` computing in
    the weights' dtype, the layers `load_model(..., "4bit")` gives; the LM head stays as it is (as
    transformers leaves it)."""
    import bitsandbytes as bnb

    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            w = child.weight
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=False,
                compute_dtype=w.dtype,
                quant_type="nf4",
                device="meta",
            )
            layer.weight = bnb.nn.Params4bit(w.data, requires_grad=False, quant_type="nf4").to(w.device)
            if child.bias is not None:
                layer.bias = child.bias
            setattr(parent, child_name, layer)
    return model


def have_bitsandbytes() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return False
    return True


def curves(sizes: Sizes, out: Path, deadline: float) -> tuple[dict, str]:
    nf4 = have_bitsandbytes()
    with tempfile.TemporaryDirectory() as tmp:
        one = Sweep(Path(tmp) / "curve.jsonl", verify_curve.CURVE_KEY)
        many = Sweep(Path(tmp) / "batch.jsonl", batch_curve.BATCH_CURVE_KEY)
        for name, hub_id in {**TARGETS, **DRAFTS}.items():
            if time.perf_counter() > deadline:
                break
            role = "target" if name in TARGETS else "draft"
            model = random_model(hub_id, sizes)
            nodes = sizes.curve_nodes if role == "target" else [max(n, 1) for n in sizes.curve_nodes]
            measure_curves(sizes, (one, many), model, name, role, sorted(set(nodes)))
            if role == "target" and nf4 and time.perf_counter() < deadline:
                measure_curves(sizes, (one, many), quantize_nf4(model), name + NF4, role, sorted(set(nodes)))
            del model
            if sizes.device == "cuda":
                torch.cuda.empty_cache()
        frames = [verify_curve.curve_table(one).assign(batch=1), batch_curve.batch_curve_table(many)]
    table = pd.concat(frames, ignore_index=True)
    table.loc[table["kind"].isna(), "kind"] = table["role"].map({"target": "verify", "draft": "plain"})
    table.to_csv(out / "curves.csv", index=False)
    headline, markdown_table = curve_headline(table, sizes)
    headline["nf4"] = "measured" if nf4 else "not measured: bitsandbytes is not installed"
    return headline, markdown_table


def measure_curves(sizes: Sizes, stores: tuple[Sweep, Sweep], model, name: str, role: str, nodes: list[int]) -> None:
    """`model`'s curve at each cache size: batch 1 into the first store, larger batches into the second."""
    one, many = stores
    config = verify_curve.CurveConfig(warmup=2, repeats=sizes.curve_repeats, progress=False)
    batches = [b for b in sizes.curve_batches if b > 1]
    for prefix in sizes.curve_prefixes:
        verify_curve.verify_curve(one, model, name, prefix, nodes, role, config)
        batch_curve.batch_curve(many, model, name, role, prefix, batches, nodes, config)


def curve_headline(table: pd.DataFrame, sizes: Sizes) -> tuple[dict, str]:
    """The targets' verify time at 0, 1, 16 and 64 nodes (or the largest measured), per cache and batch."""
    verify = table[(table["role"] == "target") & (table["kind"] == "verify")]
    wide = verify.pivot_table(index=["model", "prefix", "batch"], columns="nodes", values="median_ms").reset_index()
    wide.columns = [f"{c} nodes ms" if isinstance(c, int | float) else c for c in wide.columns]
    headline = {"models": sorted(table["model"].unique()), "points": len(table)}
    return headline, markdown(wide)


def cost(sizes: Sizes, out: Path, deadline: float) -> tuple[dict, str]:
    """The best budget per shape from the measured curves (batch 1) and the borrowed acceptance vectors."""
    curve = pd.read_csv(out / "curves.csv")
    curve = curve[curve["batch"] == 1]
    borrowed = json.loads(sizes.acceptance_file.read_text())
    rows = []
    measured = set(curve["model"])
    pairs = list(PAIRS) + [(d, t + NF4) for d, t in PAIRS if t + NF4 in measured]
    for vector in borrowed["vectors"]:
        for draft, target in pairs:
            for prefix in sizes.curve_prefixes:
                at = curve[curve["prefix"] == prefix]
                table = cost_model.cost_table(at, COST_SHAPES, vector["acceptance"], target, draft)
                best = cost_model.best_budgets(table, by=["shape"])
                rows.append(best.assign(prefix=prefix, acceptance=vector["label"]))
    frame = pd.concat(rows, ignore_index=True)
    frame["acceptance_note"] = borrowed["note"]
    frame.to_csv(out / "cost.csv", index=False)
    cols = ["acceptance", "target", "draft", "prefix", "shape", "nodes", "expected_tau", "t_step_s", "speedup"]
    return {"acceptance": borrowed["note"]}, markdown(frame[cols])


PARTS: dict[str, Callable[[Sizes, Path, float], tuple[dict, str]]] = {
    "exactness": exactness,
    "sampling": sampling,
    "attention": attention_part,
    "curves": curves,
    "cost": cost,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the CSVs and the summary")
    parser.add_argument("--dry", action="store_true", help="CPU rehearsal at tiny sizes")
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--acceptance", type=Path, default=ACCEPTANCE_FILE, help="acceptance vectors (JSON)")
    args = parser.parse_args(argv)
    if not args.dry and not torch.cuda.is_available():
        print("no CUDA device: run with --dry for the CPU rehearsal", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = replace(DRY if args.dry else FULL, acceptance_file=args.acceptance)
    report = Report(args.out, sizes)
    print(json.dumps(report.env), flush=True)
    for name in args.parts:
        report.run(name, PARTS[name])
    print((args.out / "summary.md").read_text(), flush=True)
    return 0 if all(p["status"] == "ok" for p in report.parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
