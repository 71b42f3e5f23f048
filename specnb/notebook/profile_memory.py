"""Will a profile's notebooks fit on its GPU, and how much does it download? Estimates from the
committed configs (`io.model_configs`): the memory is `notebook.run_memory`'s estimate of each
notebook, the one that refuses a run that does not fit before any model loads, sized for CUDA; the
downloads are `analysis.memory`'s arithmetic.

    python -m specnb.notebook.profile_memory [PROFILE] [-f FILE ...] [--usable-gb GB]

-f: parameter files layered on the profile as `run_notebooks.sh -f` layers them (e.g. your
`custom_trees`, notebooks/my_trees.example.yaml): the user's trees are sized where the notebooks
measure them (every notebook that takes trees verifies or times a custom tree at its node count).

What it holds:
    T4_USABLE                   the bytes a T4 offers the models, caches and activations
    resolved                    the profile's parameters per notebook, with -f files layered on
    custom_trees_of             a notebook's custom trees (its own and its pairs')
    profile_memory              `run_memory.estimate_run` of every notebook of the profile, on CUDA
    memory_markdown             docs/t4.md's memory table: one row per notebook, its parts and whether it fits
    published_download          the download of a published Medusa or EAGLE checkpoint
    profile_downloads           what the profile downloads (models, Medusa and EAGLE heads), from the configs
    download_markdown           docs/colab.md's download table; drive_warning: the cache on a free Drive
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
    download_bytes,
    eagle_head_bytes,
    medusa_heads_bytes,
    parameter_count,
)
from ..core.trees import Tree
from ..io.medusa_checkpoint import PublishedHeads
from ..io.model_configs import config_of, hub_model
from ..io.published import published_checkpoints
from ..io.tree_spec import TreeSpecError, parse_custom_trees
from .places import NOTEBOOKS
from .profiles import RunnerError, hub_models, notebooks, published_heads, resolve
from .run_memory import PART_NAMES, RunMemory, estimate_run, gb

T4_USABLE = int(14 * GB)  # of the T4's 15 GB, what the models, caches and activations may take


def resolved(profile: str, files: Sequence[str | Path] = (), folder: Path = NOTEBOOKS) -> dict[str, dict[str, Any]]:
    """The profile's parameters per notebook of `folder` (profiles in its profiles/), with parameter
    files (`run_notebooks.sh -f`) layered on."""
    return resolve(profile, {}, [Path(f) for f in files], notebooks(folder), folder / "profiles")


def custom_trees_of(params: dict[str, Any]) -> dict[str, Tree]:
    """One notebook's custom trees by name (`custom_trees`, and 02's pairs' own): each is verified,
    timed or costed at its node count where the notebook takes trees."""
    specs = [params.get("custom_trees")] + [p.get("custom_trees") for p in params.get("pairs", []) or []]
    return {n: t for s in specs for n, t in parse_custom_trees(s).items()}


def profile_memory(profile: str, files: Sequence[str | Path] = ()) -> list[RunMemory]:
    """Every notebook's memory estimate for the profile's parameters, on CUDA (`run_memory.estimate_run`)."""
    return [estimate_run(notebook, params, device="cuda") for notebook, params in resolved(profile, files).items()]


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


def profile_downloads(profile: str, folder: Path = NOTEBOOKS) -> list[Download]:
    """What the profile's notebooks (in `folder`) download from the hub: every hub model they name
    (committed configs, parameters x the dtype of the hub's files) and the published heads they load."""
    resolved = resolve(profile, {}, [], notebooks(folder), folder / "profiles")
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


def memory_markdown(profile: str = "t4", usable: int = T4_USABLE, files: Sequence[str | Path] = ()) -> str:
    """docs/t4.md's memory table: one row per notebook, its parts and total in GB against `usable`,
    then what each estimate assumed (`RunMemory.notes`) and the prompt length assumed."""
    rows = profile_memory(profile, files)
    shown = [k for k in PART_NAMES if any(r.parts()[k] for r in rows)]
    lines = [
        "| notebook | " + " | ".join(PART_NAMES[k] for k in shown) + f" | total | fits in {usable / GB:g} GB |",
        "|---|" + "---|" * (len(shown) + 2),
    ]
    for r in rows:
        parts = " | ".join(gb(r.parts()[k]) if r.parts()[k] else "" for k in shown)
        fits = "yes" if r.total <= usable else "**NO**"
        lines.append(f"| {r.notebook} | {parts} | **{gb(r.total)}** | {fits} |")
    notes = [f"{r.notebook}: {'; '.join(r.notes)}." for r in rows if r.notes]
    lines += [
        "",
        f"GB = 10^9 bytes; profile `{profile}` on CUDA, models in {rows[0].dtype if rows else 'float16'} (4-bit "
        f"where the profile quantizes them); the longest prompt assumed {LONGEST_PROMPT} tokens (05 and 06: at "
        "most their max_prompt_tokens); runtime: the CUDA context. `specnb.notebook.run_memory` sizes each part; "
        "the same estimate refuses a run that does not fit the machine, before any model loads.",
        *notes,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.profile_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("profile", nargs="?", default="t4")
    ap.add_argument("-f", dest="files", action="append", default=[], help="a parameter file on top (custom_trees)")
    ap.add_argument("--usable-gb", type=float, default=T4_USABLE / GB, help="GB the device offers")
    args = ap.parse_args(argv)
    try:
        print(memory_markdown(args.profile, int(args.usable_gb * GB), args.files))
        print("\nDownloads:\n\n" + download_markdown(args.profile))
    except (RunnerError, KeyError, TreeSpecError) as e:
        print(f"profile_memory: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
