"""How long the `t4` profile takes on a Colab T4: an ESTIMATE from published figures and the
profile's own sizes, not a measurement. docs/t4.md's figure is this module's output (a test checks
that they agree).

    python -m specnb.notebook.t4_estimate [PROFILE] [-f FILE ...]   the table by notebook and part, and the total

-f: parameter files layered on the profile as `run_notebooks.sh -f` layers them: the user's
`custom_trees` are counted where the notebooks run them (01: checked end to end and on the verify
curve; 02: run as methods; 03: timed in the grid and on the curve; 06: on the batched curves and runs;
05 replays them, which costs no model time).

Inputs, `T4Figures` (each with its source or marked as an assumption), and how they combine:
    decode step      a 4-bit target's single-row step: bitsandbytes' published T4 step for Qwen2.5-3B
                     in nf4 (batch 1), scaled by the target's nf4 weight bytes over
                     Qwen2.5-3B's (`analysis.memory.weight_bytes` of both configs): decoding reads
                     every weight once, so its time follows the bytes
    verify of r rows the same benchmark's 8-row step over its 1-row step (`nf4_rows8_over_1` = s),
                     extended as a power law: step x r ** (log s / log 8) (an assumption beyond 8 rows)
    draft forward    a float16 draft at batch 1: the larger of its layers' kernel launches
                     (`launch_per_layer_s`, an assumption) and its weight bytes over the T4's memory
                     bandwidth
    a speculative run of n tokens with a tree of N nodes and depth d: n / tau steps of one verify of
                     N + 1 rows and d draft forwards (tau an assumption, `tau`); the target alone: n
                     steps; every generation also pays a prefill (a verify of the prompt's rows) and a
                     perplexity pass (a verify of prompt + output rows)
    loads            every model a notebook loads, its hub files read at `load_bytes_per_s` (4-bit
                     quantization on load included); downloads once at `download_bytes_per_s`
What each notebook runs is counted from the profile's parameters (prompts, tokens, methods, trees,
curves, grid), as the notebooks run them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from transformers import Qwen2Config

from ..analysis.memory import FLOAT16_BYTES, LONGEST_PROMPT, download_bytes, weight_bytes
from ..bench.attention_grid import head_shape
from ..core.trees import Tree
from ..drafters.methods import budget_axis, parse_method, trees_for, with_custom_trees
from ..experiments.long_generation import TARGET_ALONE
from ..io.model_configs import config_of, hub_model
from ..io.published import published_checkpoints
from ..io.tree_spec import TreeSpecError
from . import registry
from .places import NOTEBOOKS
from .profile_memory import custom_trees_of, profile_downloads, published_download, resolved
from .profiles import RunnerError

FIGURES_FILE = Path(__file__).with_name("t4_figures.json")  # the inputs, each with its source (`T4Figures`)


@dataclass(frozen=True)
class T4Figures:
    """The inputs (FIGURES_FILE: each value with its source, or marked as an assumption)."""

    nf4_step_3b_s: float
    nf4_rows8_over_1: float
    launch_per_layer_s: float
    bandwidth_bytes_per_s: float
    attention_call_floor_s: float
    tau: float
    download_bytes_per_s: float
    load_bytes_per_s: float
    setup_s: float
    flex_compile_s: float
    prompt_tokens: int

    @classmethod
    def published(cls, path: Path | None = None) -> T4Figures:
        """The inputs as FIGURES_FILE (or `path`) gives them."""
        data = json.loads(Path(path or FIGURES_FILE).read_text())
        return cls(**{name: entry["value"] for name, entry in data.items()})


def qwen25_3b_nf4_bytes() -> int:
    """The nf4 weight bytes of Qwen2.5-3B, the model of bitsandbytes' published T4 figures (its
    config.json sizes: hidden 2048, intermediate 11008, 36 layers, 16 heads, 2 key-value heads,
    vocabulary 151936, tied embeddings)."""
    config = Qwen2Config(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    return weight_bytes(config, "4bit").total


class Costs:
    """Seconds of the T4's basic operations for one profile's models."""

    def __init__(self, figures: T4Figures) -> None:
        self.f = figures
        self.reference = qwen25_3b_nf4_bytes()
        self.exponent = math.log(figures.nf4_rows8_over_1) / math.log(8)

    def step(self, target: str, quantization: str | None) -> float:
        """One single-row decoding step of the target."""
        return self.f.nf4_step_3b_s * weight_bytes(config_of(target), quantization).total / self.reference

    def verify(self, target: str, quantization: str | None, rows: int) -> float:
        return self.step(target, quantization) * max(rows, 1) ** self.exponent

    def draft(self, draft: str) -> float:
        """One float16 forward of the draft at batch 1."""
        config = config_of(draft)
        return max(
            config.num_hidden_layers * self.f.launch_per_layer_s,
            weight_bytes(config, None).total / self.f.bandwidth_bytes_per_s,
        )

    def generation(
        self, target: str, quantization: str | None, draft: str | None, tree: Tree | None, tokens: int, prompt: int
    ) -> float:
        """One generation with its prefill and its perplexity pass: the target alone (tree None), a
        speculative run with a draft model, or with heads (draft None: drafting costs nothing)."""
        fixed = self.verify(target, quantization, prompt) + self.verify(target, quantization, prompt + tokens)
        if tree is None:
            return fixed + tokens * self.step(target, quantization)
        per_step = self.verify(target, quantization, tree.num_nodes + 1) + (
            tree.depth * self.draft(draft) if draft else 0.0
        )
        return fixed + tokens / self.f.tau * per_step

    def collection(
        self, target: str, quantization: str | None, draft: str, tokens: int, draft_pass: bool = True
    ) -> float:
        """One prompt of a collection that makes its own continuation: an exact chain:4 run and
        (draft_pass) the teacher-forced draft pass."""
        run = self.generation(target, quantization, draft, Tree.chain(4), tokens, self.f.prompt_tokens)
        return run + (self.draft(draft) if draft_pass else 0.0)

    def continuations(self, target: str, quantization: str | None, tokens: int, batch: int) -> float:
        """One batch of `batch` prompts' continuations decoded together (`experiments.continuations`):
        the ragged prefill, then one verify of `batch` rows per token."""
        prefill = self.verify(target, quantization, batch * self.f.prompt_tokens)
        return prefill + tokens * self.verify(target, quantization, batch)

    def super_trees(self, draft: str, tokens: int, depth: int) -> float:
        """One prompt's super-trees: a draft forward per depth for each chunk of 8 positions."""
        return math.ceil(tokens / 8) * depth * self.draft(draft)

    def curve(self, target: str, quantization: str | None, draft: str, nodes: Sequence[int], rows: int = 1) -> float:
        """One pass of a verify-cost curve: a verify of rows x (n + 1) and a draft forward per point n."""
        return sum(self.verify(target, quantization, rows * (n + 1)) for n in nodes) + len(nodes) * self.draft(draft)

    def load(self, name: str) -> float:
        """Reading (and quantizing) a model's hub files, or a published head checkpoint's."""
        if name in published_checkpoints():
            size = published_download(name).bytes
        else:
            size = download_bytes(config_of(name), hub_model(name).weights_dtype)
        return size / self.f.load_bytes_per_s


def _row(notebook: str, part: str, count: float, each: float) -> dict:
    return {"notebook": notebook, "part": part, "count": count, "each_s": each, "seconds": count * each}


def estimate(
    profile: str = "t4", figures: T4Figures | None = None, files: Sequence[str | Path] = (), folder: Path = NOTEBOOKS
) -> pd.DataFrame:
    """One row per (notebook, part): the notebook's number ("set-up" before them) and stem, the part,
    how many of it, seconds each, seconds in all (an estimate), each notebook by the rule its spec
    names (`registry`); files: parameter files on top of the profile (the user's custom trees);
    figures: default `T4Figures.published()`; folder: the notebooks (and their profiles/)."""
    p = resolved(profile, files, folder)
    f = figures or T4Figures.published()
    c = Costs(f)
    rows = [
        _row("set-up", "pip install (assumption)", 1, f.setup_s),
        _row(
            "set-up",
            "downloads",
            sum(d.bytes for d in profile_downloads(profile, folder)) / f.download_bytes_per_s,
            1.0,
        ),
    ]
    rows = [r | {"stem": "set-up"} for r in rows]
    decoded: set[tuple[str, str | None]] = set()  # targets whose continuations a notebook decoded already
    for stem, params in p.items():
        spec = registry.spec(stem, folder)
        rule = RULES.get(spec.t4)
        if rule is None:
            raise KeyError(f"{stem}: its spec names the T4 rule {spec.t4!r}; known: {sorted(RULES)}")
        rows += [r | {"stem": stem} for r in rule(params, c, spec.number or stem, decoded)]
    return pd.DataFrame(rows)


def _tree_shapes_rows(a: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 01 (parameters `a`): the collection, super-trees, check runs, the verify curve."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    t, tq, d = a["target"], a["target_quantization"], a["draft"]
    n, prompts = a["max_new_tokens"], a["max_prompts"]
    custom = custom_trees_of(a)
    named = {parse_method(m, custom).shape for m in a["check_methods"]}
    extra = [tree for name, tree in custom.items() if name not in named]  # with_custom_trees: each checked
    verify_nodes = budget_axis(a["verify_nodes"], custom)  # the curve at the custom trees' sizes too
    r = a["run_tokens"]
    batch = a["batch"]
    decoded.add((t, tq))  # its continuations: a later notebook with this target reads them
    rows += [
        _row(nb, "load target and draft", 1, c.load(t) + c.load(d)),
        _row(
            nb,
            f"the target's continuations, {batch} prompts at once (02 reads them)",
            math.ceil(prompts / batch),
            c.continuations(t, tq, n, batch),
        ),
        _row(nb, "teacher-forced draft pass (ranks)", prompts, c.draft(d)),
        _row(
            nb,
            f"super-trees (depth {a['super_depth']}, chunks of 8 positions)",
            min(a["super_prompts"] or prompts, prompts),
            c.super_trees(d, n, a["super_depth"]),
        ),
        _row(nb, "check runs: target alone", a["check_prompts"], c.generation(t, tq, None, None, r, prompt)),
        _row(
            nb,
            "check runs: methods",
            a["check_prompts"] * len(a["check_methods"]),
            c.generation(t, tq, d, Tree.sparse(16), r, prompt),
        ),
        _row(
            nb,
            "recommended tree run end to end, the target alone beside it (a 16-node tree assumed)",
            a["measure_prompts"],
            c.generation(t, tq, None, None, r, prompt) + c.generation(t, tq, d, Tree.sparse(16), r, prompt),
        ),
        _row(nb, "verify-cost curve", a["verify_repeats"] + 1, c.curve(t, tq, d, verify_nodes)),
    ]
    if extra:
        rows.append(
            _row(
                nb,
                f"check runs: {len(extra)} custom trees",
                a["check_prompts"],
                sum(c.generation(t, tq, d, tree, r, prompt) for tree in extra),
            )
        )
    return rows


def _pairs_rows(b: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 02 (parameters `b`): per pair its loads, target alone, methods end to end on the first
    method_prompts prompts, the grid; decoded: targets whose continuations 01 decoded already."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    n2, prompts2, rounds2 = b["run_tokens"], b["method_prompts"], b["rounds"]  # every timed run, rounds times
    targets_seen: set[str] = set()
    loaded: set[str] = set()  # run_pairs keeps a model loaded while a later pair still uses it
    custom = custom_trees_of(b)
    everyone = with_custom_trees(b["methods"], custom)  # the notebook adds each custom tree no method names
    for i, pair in enumerate(b["pairs"]):
        t, tq, d = pair["target"], pair.get("target_quantization"), pair["draft"]
        methods = [parse_method(m, custom) for m in (pair.get("methods") or everyone)]
        shared = hub_model(t).tokenizer.family == hub_model(d).tokenizer.family
        label = f"{d} -> {t}"
        loaded &= {x for later in b["pairs"][i:] for x in (later["target"], later["draft"])}
        rows.append(_row(nb, f"{label}: load", 1, sum(c.load(x) for x in {t, d} - loaded)))
        loaded |= {t, d}
        if t not in targets_seen:
            targets_seen.add(t)
            rows.append(
                _row(nb, f"{label}: target alone", prompts2 * rounds2, c.generation(t, tq, None, None, n2, prompt))
            )
        run = [
            m
            for m in methods
            if (m.shared_vocabulary <= shared) and not (b["replay"] and m.replayable and m.spec not in b["measure"])
        ]
        replayed = [m for m in methods if shared and b["replay"] and m.replayable and m.spec not in b["measure"]]
        rows.append(
            _row(
                nb,
                f"{label}: {len(run)} methods end to end",
                prompts2 * len(run) * rounds2,
                sum(c.generation(t, tq, d, m.tree, n2, prompt) for m in run) / max(len(run), 1),
            )
        )
        if replayed:
            rows.append(
                _row(
                    nb,
                    f"{label}: one collection for {len(replayed)} replayed trees",
                    prompts2,
                    c.collection(t, tq, d, n2) + c.super_trees(d, n2, 6),
                )
            )
        if b.get("grid"):
            mine = {**b, **{k: pair[k] for k in ("shapes", "budgets", "dynamic_budgets") if pair.get(k) is not None}}
            mine["max_prompts"] = min(pair.get("grid_prompts") or b["max_prompts"], b["max_prompts"])
            rows += _grid_rows(mine, c, nb, label, (t, tq, d), shared, custom, (t, tq) in decoded)
            decoded.add((t, tq))
    return rows


def _grid_rows(
    b: dict, c: Costs, nb: str, label: str, models: tuple, shared: bool, custom: dict, decoded: bool = False
) -> list[dict]:
    """Notebook 02's grid of one pair: the target's continuations (unless 01 or an earlier pair decoded
    them), the teacher-forced draft pass, super-trees on super_prompts; across tokenizers, every
    distinct tree re-drafted for every prompt at once (about max_new_tokens / 2 steps, one batched draft
    forward per level) and the dynamic trees on super_prompts, one prompt at a time."""
    t, tq, d = models
    n, prompts, batch = b["max_new_tokens"], b["max_prompts"], b["batch"]
    rows = []
    if not decoded:
        rows.append(
            _row(
                nb,
                f"{label}: the target's continuations, {batch} prompts at once",
                math.ceil(prompts / batch),
                c.continuations(t, tq, n, batch),
            )
        )
    if shared:
        rows.append(_row(nb, f"{label}: teacher-forced draft pass (ranks)", prompts, c.draft(d)))
        if b["super_k"]:
            rows.append(
                _row(
                    nb,
                    f"{label}: the grid's super-trees (depth {b['super_depth']})",
                    min(b["super_prompts"] or prompts, prompts),
                    c.super_trees(d, n, b["super_depth"]),
                )
            )
        return rows
    trees = trees_for(b["shapes"], b["budgets"], custom)
    distinct = {tuple(sorted(tree.paths)): tree for tree in trees.values()}
    levels = sum(tree.depth + 1 for tree in distinct.values())  # each step feeds the accepted tokens, then a level
    rows.append(
        _row(
            nb,
            f"{label}: the grid re-drafted across tokenizers, every prompt at once ({len(distinct)} trees)",
            math.ceil(n / 2),
            levels * c.draft(d),
        )
    )
    dynamic = len(b["dynamic_budgets"]) * (b["super_depth"] + 1)
    rows.append(
        _row(
            nb,
            f"{label}: dynamic trees re-drafted, one prompt at a time",
            min(b["super_prompts"] or prompts, prompts) * math.ceil(n / 2),
            dynamic * c.draft(d),
        )
    )
    return rows


def _attention_rows(g: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 03 (parameters `g`): the attention grid, FlexAttention's compile, the verify curve."""
    f = c.f
    rows: list[dict] = []
    heads = head_shape(g["attention_shape"] or g["target"])  # the target's config unless given
    calls = 0.0
    custom = list(custom_trees_of(g).values())  # timed at every batch and prefix, at their node count
    verify_nodes = budget_axis(g["verify_nodes"], custom_trees_of(g))
    trees = [Tree.sparse(n) for n in g["nodes"]] + custom
    for batch in g["batches"]:
        for prefix in g["prefixes"]:
            for tree in trees:
                nodes = tree.num_nodes
                kv = 2 * batch * heads.kv_heads * (prefix + nodes) * heads.head_dim * FLOAT16_BYTES
                one = max(f.attention_call_floor_s, kv / f.bandwidth_bytes_per_s)
                leaves = len(tree.leaves)
                per_impl = {"per_sequence": leaves * one, "eager": 3 * one}
                calls += sum(per_impl.get(i, one) for i in g["impls"]) * (g["warmup"] + g["repeats"])
    t, tq, d = g["target"], g["target_quantization"], g["draft"]
    rows += [
        _row(nb, "attention grid (every implementation, warm-up and repeats)", 1, calls),
        _row(nb, "FlexAttention compile (assumption)", int("flex" in g["impls"]), f.flex_compile_s),
        _row(nb, "load target and draft", 1, c.load(t) + c.load(d)),
        _row(nb, "verify-cost curve", g["verify_repeats"] + 1, c.curve(t, tq, d, verify_nodes)),
    ]
    return rows


def _long_rows(h: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """A notebook that generates (04, and the rule of a notebook whose spec names no other): every
    method (`methods`, else the target alone) on max_prompts prompts x max_new_tokens tokens, over
    every cache window (`windows`: 04's), and its models' loads."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    t, tq, d = h.get("target") or "", h.get("target_quantization"), h.get("draft") or ""
    if not t:
        return rows
    windows = len({0, *(h.get("windows") or [])})
    tokens, prompts = h.get("max_new_tokens") or 0, h.get("max_prompts") or 1
    for m in h.get("methods") or [TARGET_ALONE]:
        tree = None if m == TARGET_ALONE else parse_method(m).tree
        rows.append(
            _row(
                nb,
                f"{m}: {tokens} tokens x {windows} caches",
                prompts * windows,
                c.generation(t, tq, d if tree is not None else None, tree, tokens, prompt),
            )
        )
    rows.append(_row(nb, "load target and draft", 1, c.load(t) + (c.load(d) if d else 0.0)))
    return rows


def _learned_rows(m: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 05 (parameters `m`): heads' collections, re-drafted EAGLE-2 trees, timed runs."""
    prompt = c.f.prompt_tokens
    rows: list[dict] = []
    t, tq, d, n5 = m["target"], m["target_quantization"], m["draft"], m["max_new_tokens"]
    tree = Tree.sparse(max(m["budgets"])).truncated(5)
    speed_tree = Tree.sparse(m["speed_budget"]).truncated(5)
    eagle = m.get("eagle_heads") if m.get("eagle_heads") in published_checkpoints() else None  # published: sized
    loaded = m["heads"] != "train" or m["eagle_heads"] != "train"
    measured = m["test_prompts"] // 2 if loaded else m["test_prompts"]  # loaded heads: trees designed on the other half
    rounds = m.get("rounds", 1)
    rows += [
        _row(
            nb,
            "load target, heads" + (", EAGLE head" if eagle else "") + " and draft",
            1,
            c.load(t) + c.load(m["heads"]) + (c.load(eagle) if eagle else 0.0) + (c.load(d) if d else 0.0),
        ),
        _row(
            nb,
            "head collections (a Medusa run and an EAGLE run per test prompt)",
            2 * m["test_prompts"],
            c.generation(t, tq, None, tree, n5, prompt),
        ),
        _row(
            nb,
            "draft-model collection (the measured prompts)",
            measured if d else 0,
            c.collection(t, tq, d, n5) if d else 0.0,
        ),
        # one head forward (a decoder layer and the LM head) per depth and position: two layers' launches (assumption)
        _row(
            nb,
            "EAGLE-2 trees re-drafted at every position (head forwards only, depth x tokens)",
            m["test_prompts"],
            n5 * m.get("eagle_depth", 6) * 2 * c.f.launch_per_layer_s,
        ),
        _row(
            nb,
            "timed: target alone, 3 best static trees, EAGLE-2's and the draft's dynamic trees",
            measured * rounds,
            c.generation(t, tq, None, None, n5, prompt)
            + 3 * c.generation(t, tq, None, speed_tree, n5, prompt)
            + ((1 + bool(m.get("draft_dynamic"))) * c.generation(t, tq, d, speed_tree, n5, prompt) if d else 0.0),
        ),
        _row(
            nb,
            "typical vs lossless: target sample + 2 runs",
            m["typical_prompts"],
            c.generation(t, tq, None, None, n5, prompt) + 2 * c.generation(t, tq, None, tree, n5, prompt),
        ),
    ]
    return rows


def _batch_rows(z: dict, c: Costs, nb: str, decoded: set) -> list[dict]:
    """Notebook 06 (parameters `z`): the collection, references, batched cost curves and runs per batch."""
    prompt, f = c.f.prompt_tokens, c.f
    rows: list[dict] = []
    t, tq, d, n6 = z["target"], z["target_quantization"], z["draft"], z["max_new_tokens"]
    chain = Tree.chain(z["k"])
    custom = custom_trees_of(z)  # replayed and costed beside the shapes, the shapes also at their node count
    budgets = budget_axis(z["budgets"], custom)
    sizes = {Tree.preset(s, x).num_nodes for s in z["shapes"] for x in budgets} | {t.num_nodes for t in custom.values()}
    widest = max(sizes)
    rows += [
        _row(nb, "load target and draft", 1, c.load(t) + c.load(d)),
        _row(nb, "collection for tau (chain:4 run per prompt)", z["max_prompts"], c.collection(t, tq, d, n6)),
        _row(
            nb,
            "each row's batch-1 greedy reference (the target alone)",
            max(z["batches"]),
            c.generation(t, tq, None, None, n6, prompt),
        ),
    ]
    for b in z["batches"]:
        nodes = sorted({0, *sizes})
        rows.append(_row(nb, f"batched cost curves at batch {b}", z["curve_repeats"] + 1, c.curve(t, tq, d, nodes, b)))
        alone = n6 * c.verify(t, tq, b)  # one decoding step of b rows per token
        spec = sum(
            n6 / f.tau * (c.verify(t, tq, b * (tree.num_nodes + 1)) + tree.depth * c.draft(d))
            for tree in (chain, Tree.sparse(widest))
        )
        rows.append(
            _row(
                nb,
                f"batch {b}: target alone, transformers' batched generate, chain and the best tree",
                z["rounds"],
                2 * alone + spec,
            )
        )
    return rows


RULES = {  # a notebook's spec names its rule (`registry.NotebookSpec.t4`)
    "tree_shapes": _tree_shapes_rows,
    "model_pairs": _pairs_rows,
    "attention_timing": _attention_rows,
    "generation": _long_rows,
    "learned_drafters": _learned_rows,
    "batch_size": _batch_rows,
    "none": lambda params, c, nb, decoded: [],
}


def estimate_markdown(profile: str = "t4", figures: T4Figures | None = None, files: Sequence[str | Path] = ()) -> str:
    """docs/t4.md's summary: minutes per notebook and in all, with the inputs named."""
    table = estimate(profile, figures, files)
    by = table.groupby("notebook", sort=False)["seconds"].sum() / 60
    parts = ", ".join(f"{name} {minutes:.0f} min" for name, minutes in by.items())
    return (
        f"**About {table['seconds'].sum() / 60:.0f} min for `./run_notebooks.sh {profile}`** (an estimate: {parts}; "
        f"`python -m specnb.notebook.t4_estimate {profile}` prints every part and its inputs)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.t4_estimate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("profile", nargs="?", default="t4")
    ap.add_argument("-f", dest="files", action="append", default=[], help="a parameter file on top (custom_trees)")
    args = ap.parse_args(argv)
    try:
        table = estimate(args.profile, files=args.files)
    except (RunnerError, KeyError, TreeSpecError) as e:
        print(f"t4_estimate: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_colwidth", 80, "display.max_rows", 200):
        print(table.round(2).to_string(index=False))
    print(f"\ninputs ({FIGURES_FILE.name}): {T4Figures.published()}")
    print(f"longest prompt assumed by the memory table: {LONGEST_PROMPT} tokens")
    print(estimate_markdown(args.profile, files=args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
