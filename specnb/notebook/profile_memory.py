"""Will a profile's pairs fit on its GPU, and how much does it download? An estimate from the committed
configs (`io.model_configs`) and the arithmetic of `analysis.memory`, for the pairs and sizes the
profile's notebooks use.

    python -m specnb.notebook.profile_memory [PROFILE] [-f FILE ...] [--prompt TOKENS] [--usable-gb GB]

-f: parameter files layered on the profile as `run_notebooks.sh -f` layers them (e.g. your
`custom_trees`, notebooks/my_trees.example.yaml): the user's trees are sized where the notebooks
measure them (every notebook that takes trees verifies or times a custom tree at its node count).

What it holds:
    LONGEST_PROMPT, T4_USABLE   the assumptions: the longest prompt (tokens) and the bytes a T4 offers
    resolved                    the profile's parameters per notebook, with -f files layered on
    profile_pairs               every distinct draft -> target pair the profile's notebooks load
                                (02's pairs, 01's pair, 03's verify-cost pair), and the refused ones
    profile_budget              the longest sequence: prompt + the largest max_new_tokens + the largest
                                tree (the user's custom trees included)
    custom_trees_of             a notebook's custom trees (its own and its pairs')
    profile_memory              one `PairMemory` per pair that shares a vocabulary
    grid_bytes                  notebook 03's largest attention-grid point (no model loaded then)
    memory_markdown             docs/t4.md's memory table
    published_download          the download of a published Medusa or EAGLE checkpoint
    profile_downloads           what the profile downloads (models, Medusa and EAGLE heads), from the configs
    download_markdown           docs/colab.md's download table; drive_warning: the cache on a free Drive

Assumptions, printed with the table: prompts are at most LONGEST_PROMPT tokens (the Spec-Bench prompts
the t4 profile selects: its longest, a RAG prompt, ~940 Llama-2 tokens, an estimate); one budget is used
for every pair (the largest max_new_tokens and tree of any notebook: an upper bound); the draft is
float16 unless the profile quantizes it; 01's super-trees (draft-only feeds of off-path nodes) and
activations other than the logits are not counted; the CUDA context (a few hundred MB) is what the
margin between the T4's 15 GB and the 14 GB budget is for.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.memory import (
    DTYPE_BYTES,
    GB,
    LONGEST_PROMPT,
    PairMemory,
    TokenBudget,
    attention_grid_bytes,
    download_bytes,
    eagle_head_bytes,
    medusa_heads_bytes,
    memory_table,
    pair_memory,
    parameter_count,
)
from ..bench.attention_grid import head_shape
from ..core.tree_spec import TreeSpecError, parse_custom_trees
from ..core.trees import Tree
from ..drafters.methods import parse_method
from ..experiments.long_generation import TARGET_ALONE
from ..io.medusa_checkpoint import PublishedHeads
from ..io.model_configs import config_of, hub_model
from ..io.published import published_checkpoints
from .profiles import RunnerError, hub_models, notebooks, published_heads, resolve

T4_USABLE = int(14 * GB)  # of the T4's 15 GB, what the models, caches and activations may take


@dataclass(frozen=True)
class PlannedPair:
    target: str
    target_quantization: str | None
    draft: str
    draft_quantization: str | None
    shares_vocabulary: bool  # the tokenizer families agree (`io.models.check_pair` refuses the others)


def resolved(profile: str, files: Sequence[str | Path] = ()) -> dict[str, dict[str, Any]]:
    """The profile's parameters per notebook, with parameter files (`run_notebooks.sh -f`) layered on."""
    return resolve(profile, {}, [Path(f) for f in files], notebooks())


def custom_trees_of(params: dict[str, Any]) -> dict[str, Tree]:
    """One notebook's custom trees by name (`custom_trees`, and 02's pairs' own): each is verified,
    timed or costed at its node count where the notebook takes trees."""
    specs = [params.get("custom_trees")] + [p.get("custom_trees") for p in params.get("pairs", []) or []]
    return {n: t for s in specs for n, t in parse_custom_trees(s).items()}


def profile_pairs(profile: str, files: Sequence[str | Path] = ()) -> list[PlannedPair]:
    """Every distinct pair the profile loads, in notebook order (02's list first)."""
    params = resolved(profile, files)
    found: list[tuple] = []
    for p in params.get("02_model_pairs", {}).get("pairs", []):
        found.append((p["target"], p.get("target_quantization"), p["draft"], p.get("draft_quantization")))
    for stem in ("01_tree_shapes", "03_tree_attention_timing"):
        p = params.get(stem, {})
        if "target" in p and "draft" in p:
            found.append((p["target"], p.get("target_quantization"), p["draft"], p.get("draft_quantization")))
    out = []
    for target, tq, draft, dq in dict.fromkeys(found):
        same = hub_model(target).tokenizer.family == hub_model(draft).tokenizer.family
        out.append(PlannedPair(target, tq, draft, dq, same))
    return out


def profile_budget(profile: str, longest_prompt: int = LONGEST_PROMPT, files: Sequence[str | Path] = ()) -> TokenBudget:
    """The assumed longest prompt, the largest max_new_tokens and the largest tree of any notebook
    (01's budgets and dynamic budgets, 02's method budgets, the verify-cost curves' tree sizes, and
    every custom tree: 01 checks each end to end and on its verify curve, 02 runs it, 03 times it,
    05 and 06 replay or run it at its node count)."""
    params = resolved(profile, files)
    new_tokens = max(p.get("max_new_tokens", 0) for p in params.values())
    trees = []
    for p in params.values():
        trees += list(p.get("budgets", [])) + list(p.get("dynamic_budgets", [])) + list(p.get("verify_nodes", []))
        custom = custom_trees_of(p)
        trees += [t.num_nodes for t in custom.values()]
        methods = list(p.get("methods", []) or []) + [
            m for pair in p.get("pairs", []) for m in pair.get("methods") or []
        ]
        trees += [parse_method(m, custom).budget for m in methods if m != TARGET_ALONE]  # 04 runs the target alone too
    return TokenBudget(longest_prompt, new_tokens, max(trees))


def profile_memory(
    profile: str, longest_prompt: int = LONGEST_PROMPT, usable: int = T4_USABLE, files: Sequence[str | Path] = ()
) -> list[PairMemory]:
    """One estimate per pair of the profile (hub models with committed configs), pairs across
    tokenizers included (they run the cross-tokenizer methods); files: parameter files on top."""
    budget = profile_budget(profile, longest_prompt, files)
    return [
        pair_memory(
            p.target,
            config_of(p.target),
            p.draft,
            config_of(p.draft),
            budget,
            usable,
            p.target_quantization,
            p.draft_quantization,
        )
        for p in profile_pairs(profile, files)
    ]


def grid_bytes(profile: str, files: Sequence[str | Path] = ()) -> int:
    """Notebook 03's largest grid point: q and the output [B, H, M, D], k and v [B, Hkv, P + M, D] in
    the grid's dtype, and the eager reference's float32 scores [B, H, M, P + M] (the largest tensor);
    M the largest of its node counts and its custom trees' (timed at every batch and prefix)."""
    p = resolved(profile, files)["03_tree_attention_timing"]
    heads = head_shape(p["attention_shape"] or p["target"])  # the target's config unless given
    size = 2 if p["dtype"] in ("float16", "bfloat16") else 4
    b, prefix, m = (
        max(p["batches"]),
        max(p["prefixes"]),
        max([*p["nodes"], *(t.num_nodes for t in custom_trees_of(p).values())]),
    )
    return attention_grid_bytes(b, heads.heads, heads.kv_heads, heads.head_dim, prefix, m, size)


FREE_DRIVE = int(15 * GB)  # a free Google Drive (shared with Gmail and Photos)


@dataclass(frozen=True)
class Download:
    name: str  # hub id
    what: str  # "model", "Medusa heads" or "EAGLE head"
    dtype: str  # of the files
    parameters: int
    bytes: int


def published_download(repo_id: str) -> Download:
    """A published head checkpoint (`io.published.published_checkpoints`): its tensors counted from
    its base model's config (Medusa) or its own config's sizes (EAGLE, the target's embedding
    included where the file holds it), times the bytes of the published dtype."""
    h = published_checkpoints()[repo_id]
    size_of = DTYPE_BYTES[h.dtype]
    if isinstance(h, PublishedHeads):
        base = config_of(h.base_model)
        size = medusa_heads_bytes(base.hidden_size, base.vocab_size, h.num_heads, h.num_layers, size_of)
        return Download(repo_id, "Medusa heads", h.dtype, size // size_of, size)
    size = eagle_head_bytes(h, size_of)
    return Download(repo_id, "EAGLE head", h.dtype, size // size_of, size)


def profile_downloads(profile: str) -> list[Download]:
    """What the profile's notebooks download from the hub: every hub model they name (committed
    configs, parameters x the dtype of the hub's files) and the published heads they load."""
    resolved = resolve(profile, {}, [], notebooks())
    out = []
    for hub_id in hub_models(resolved):
        model = hub_model(hub_id)
        config = config_of(hub_id)
        n = parameter_count(config)
        out.append(Download(hub_id, "model", model.weights_dtype, n, download_bytes(config, model.weights_dtype)))
    return out + [published_download(repo) for repo in published_heads(resolved)]


def download_markdown(profile: str = "t4") -> str:
    """docs/colab.md's download table: one row per repository, the total, and where to keep it."""
    rows = profile_downloads(profile)
    total = sum(r.bytes for r in rows)
    lines = ["| repository | what | parameters | files | download |", "|---|---|---|---|---|"]
    lines += [f"| {r.name} | {r.what} | {r.parameters / 1e9:.2f} B | {r.dtype} | {r.bytes / GB:.2f} GB |" for r in rows]
    lines += [
        f"| **total** | | | | **{total / GB:.1f} GB** |",
        "",
        f"GB = 10^9 bytes; parameters counted from the committed configs (a published head's from its base model's "
        f"config or its own config's sizes), times the bytes of the dtype the hub's files hold (an estimate: "
        f"tokenizers and configs add a few MB). {drive_note(total)}",
    ]
    return "\n".join(lines)


def drive_note(total: int) -> str:
    return (
        f"More than a free Google Drive's {FREE_DRIVE / GB:.0f} GB: keep the Hugging Face cache on the Colab VM's "
        "own disk (the default, ~/.cache/huggingface: re-downloaded after a disconnect, a few minutes) and put only "
        "outputs/ on Drive (SPECNB_OUTPUTS)."
        if total > FREE_DRIVE
        else f"Within a free Google Drive's {FREE_DRIVE / GB:.0f} GB."
    )


def drive_warning(profile: str, environ: dict[str, str]) -> str | None:
    """A warning when the Hugging Face cache (HF_HUB_CACHE or HF_HOME) is on Google Drive and the
    profile's downloads exceed a free Drive: the download would fail partway."""
    cache = environ.get("HF_HUB_CACHE") or environ.get("HF_HOME") or ""
    if not cache.startswith("/content/drive"):
        return None
    total = sum(r.bytes for r in profile_downloads(profile))
    if total <= FREE_DRIVE:
        return None
    return (
        f"warning: the Hugging Face cache is on Google Drive ({cache}) and profile {profile} downloads "
        f"~{total / GB:.0f} GB. {drive_note(total)}"
    )


def memory_markdown(
    profile: str = "t4", longest_prompt: int = LONGEST_PROMPT, usable: int = T4_USABLE, files: Sequence[str | Path] = ()
) -> str:
    """docs/t4.md's memory table: one row per pair, then the assumptions and the refused pairs."""
    budget = profile_budget(profile, longest_prompt, files)
    table = memory_table(profile_memory(profile, longest_prompt, usable, files))
    lines = [
        "| pair | target weights | draft weights (fp16) | KV cache, target + draft | logits | total | fits in "
        f"{usable / GB:g} GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        quant = r.target_quantization or "fp16"
        lines.append(
            f"| {r.draft} -> {r.target} | {r.target_weights_gb:.2f} ({quant}) | {r.draft_weights_gb:.2f} | "
            f"{r.target_kv_gb:.3f} + {r.draft_kv_gb:.3f} | {r.logits_gb:.3f} | **{r.total_gb:.2f}** | "
            f"{'yes' if r.fits else 'NO'} |"
        )
    across = [p for p in profile_pairs(profile, files) if not p.shares_vocabulary]
    lines += [
        "",
        f"GB = 10^9 bytes. Tokens per sequence: {budget.total} = the longest prompt, assumed "
        f"{budget.prompt} + max_new_tokens {budget.new_tokens} + the root + the largest tree, "
        f"{budget.tree} nodes (the largest of any notebook of profile `{profile}`, custom trees included), in both "
        "caches. Logits: "
        f"one forward over prompt + generated tokens in float16 (perplexity scoring).",
    ]
    if "03_tree_attention_timing" in resolved(profile, files):
        lines.append(
            f"Notebook 03's largest attention-grid point, run before its models load: "
            f"{grid_bytes(profile, files) / GB:.2f} GB."
        )
    if across:
        lines.append(
            "Across tokenizers (cross-tokenizer methods only; the shared-vocabulary ones are refused before "
            "any weights load): "
            + "; ".join(f"{p.draft} -> {p.target}" for p in across)
            + ". Their draft cache is counted at the same number of tokens "
            "(its own tokenizer's count differs a little)."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.profile_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("profile", nargs="?", default="t4")
    ap.add_argument("-f", dest="files", action="append", default=[], help="a parameter file on top (custom_trees)")
    ap.add_argument("--prompt", type=int, default=LONGEST_PROMPT, help="the longest prompt, tokens")
    ap.add_argument("--usable-gb", type=float, default=T4_USABLE / GB, help="GB the device offers")
    args = ap.parse_args(argv)
    try:
        print(memory_markdown(args.profile, args.prompt, int(args.usable_gb * GB), args.files))
        print("\nDownloads:\n\n" + download_markdown(args.profile))
    except (RunnerError, KeyError, TreeSpecError) as e:
        print(f"profile_memory: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
