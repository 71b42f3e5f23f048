"""The EAGLE head's learning curve on SmolLM2-135M: held-out accuracy and a tau proxy against the
training rows it saw, to tell whether data, optimisation steps or the recipe limits it.

The recipe, prompts and data are benchmarks/eagle.py's (`recipes`, `training_prompts`; --quick by
default, its distilled rows cached and shared). The training prompts (those not held out) are cut
to 1/8, 1/4, 1/2 and all of them (evenly spaced, each with all its segments: the greedy
continuation with its prompt rows and the sampled ones), and a fresh head is trained on each with
--schedule "epochs" (the recipe's epochs: the same optimisation steps per row seen, so a smaller
share gets fewer steps) or "steps" (the recipe's step count on all rows for every share: the same
compute, more passes over less data). Each head is measured on
    held-out     the greedy rows of the held-out prompts (the rows train_or_load measures)
    probe        the greedy rows of 16 of the prompts it trained on (evenly spaced): the fit
by top-1 and top-5 accuracy at depths 1-3 (`training.eagle.head_accuracy`'s definition: a chain
drafted along the target's own continuation from the head's predicted features) and a tau proxy:
for every row whose depth-1 token is generated, the continuation's rank path under the head
(`chain_ranks`, depths 1-7) and the draft tokens a static 64-node tree accepts on it
(`tree_design.accepted_lengths`); tau_proxy = 1 + their mean (bonus INCLUDED). That is what greedy
replay of the static tree on the target's trajectory computes, except that it averages over every
position of the continuation, not only over the roots a run's steps visit. Trees: Tree.sparse(64)
and benchmarks/eagle.py's sparse_depth6.

--samples / --max-new-tokens / --prompts change the distilled data (more continuations per prompt,
longer ones, more training prompts); the distillation is then timed (cached afterwards).

    OMP_NUM_THREADS=1 python benchmarks/eagle_learning_curve.py --threads 1
    OMP_NUM_THREADS=1 python benchmarks/eagle_learning_curve.py --schedule steps --threads 1
    OMP_NUM_THREADS=1 python benchmarks/eagle_learning_curve.py --fractions 1 --prompts 240 --epochs 6

Time: "epochs" trains 1.875 runs' worth of steps (1/8 + 1/4 + 1/2 + 1), "steps" about 4; each share is
then measured for ~35 s per row set. The "steps" schedule with the earlier 12-epoch, 2048-row recipe
took 1076 s on 1 thread with the distilled rows cached (the other core busy); an empty cache adds the
distillation (134 s for --quick's data).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import torch
from eagle import recipes, training_prompts  # benchmarks/eagle.py: the recipe measured here

from specnb.analysis.tree_design import accepted_lengths
from specnb.core.trees import Tree
from specnb.drafters.eagle import EagleHead
from specnb.io.models import load_model, prompt_ids
from specnb.io.prompts import load_prompts, spec_bench_task
from specnb.training.distillation import DistillData, distill_cached, heldout_prompts
from specnb.training.eagle import EagleConfig, chain_ranks, train_head
from specnb.training.medusa import split_prompts

TREES = {
    "sparse": Tree.sparse(64),  # the two 64-node static trees of the proxy (sparse_depth6: best-first, depth <= 6)
    "sparse_depth6": Tree.best_first(64, (0.55, 0.2, 0.1, 0.06, 0.04, 0.03, 0.02, 0.015, 0.01, 0.01), max_depth=6),
}
DEPTH = 7  # chain depth measured: the deepest of TREES
RANK_K = 16  # ranks told apart (k = not in the top 16); above every rank of TREES
assert all(max(max(p) for p in t.paths) < RANK_K for t in TREES.values())


def measure(head: EagleHead, data: DistillData, rows: torch.Tensor) -> dict[str, float]:
    """Top-1 / top-5 accuracy at depths 1-3 and the tau proxy of each tree on `rows` (module docstring)."""
    ranks = chain_ranks(head, data, rows, DEPTH, RANK_K)  # [N, DEPTH], -1 = no generated token there
    out = {}
    for d in (1, 2, 3):
        have = ranks[:, d - 1] >= 0
        for k in (1, 5):
            out[f"top{k}_d{d}"] = float((ranks[have, d - 1] < k).float().mean())
    roots = ranks[ranks[:, 0] >= 0].numpy()  # rows whose depth-1 token is generated: roots a greedy run meets
    for name, tree in TREES.items():
        out[f"tau_{name}"] = 1.0 + float(accepted_lengths(roots, tree).mean())
    out["roots"] = len(roots)
    return out


def prompt_subset(train_prompts: list[int], fraction: float) -> list[int]:
    """`fraction` of the training prompts, evenly spaced through the list (every category kept)."""
    n = max(1, int(round(fraction * len(train_prompts))))
    return [train_prompts[i] for i in np.linspace(0, len(train_prompts) - 1, n).round().astype(int)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--full", action="store_true", help="benchmarks/eagle.py's full recipe and prompts (default: --quick's)"
    )
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument(
        "--fractions", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0], help="shares of the training prompts"
    )
    ap.add_argument(
        "--schedule",
        choices=("epochs", "steps"),
        default="epochs",
        help="epochs: the recipe's epochs on every share; steps: the recipe's steps on all rows, for every share",
    )
    ap.add_argument(
        "--samples", type=int, default=None, help="sampled continuations per prompt (default: the recipe's)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=None, help="continuation length (default: the recipe's)")
    ap.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="more training-split prompts of <= 384 tokens, in all (default: the recipe's)",
    )
    ap.add_argument("--epochs", type=float, default=None, help="epochs on all rows (default: the recipe's)")
    ap.add_argument(
        "--no-probe", action="store_true", help="skip the training-prompt probe (halves the measuring time)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    target, tok = load_model(args.target)
    for p in target.parameters():  # the target is frozen
        p.requires_grad_(False)
    prompts = [(p.id, p.category, prompt_ids(tok, p.text)[0]) for p in load_prompts("spec_bench")]
    split, _ = split_prompts(prompts, group=spec_bench_task)
    base = training_prompts(split, not args.full)
    train = base  # --prompts: more of the split's short prompts after them (the held-out ones stay those of `base`)
    if args.prompts is not None:
        train = (
            base
            + [p for p in split if len(p[2]) <= 384 and p[0] not in {q[0] for q in base}][
                : max(args.prompts - len(base), 0)
            ]
        )
    config: EagleConfig = recipes(not args.full)[1]
    data_config = config.data
    if args.samples is not None:
        data_config = replace(data_config, samples=args.samples)
    if args.max_new_tokens is not None:
        data_config = replace(data_config, max_new_tokens=args.max_new_tokens)
    config = replace(config, data=data_config, epochs=args.epochs if args.epochs is not None else config.epochs)
    ids = [p for _, _, p in train]

    t0 = time.perf_counter()
    data = distill_cached(target, args.target, ids, data_config)
    distill_s = time.perf_counter() - t0
    held = heldout_prompts(len(base), config.heldout)  # indices into ids, whose first entries are `base`
    train_prompts = [j for j in range(len(ids)) if j not in set(held)]
    held_rows = torch.nonzero(torch.isin(data.prompt, torch.tensor(held)) & data.greedy_rows())[:, 0]
    all_rows = torch.nonzero(torch.isin(data.prompt, torch.tensor(train_prompts)))[:, 0]
    print(
        f"data: {len(ids)} prompts ({len(held)} held out), samples={data_config.samples}, "
        f"max_new_tokens={data_config.max_new_tokens}: {len(data.token)} rows, {len(all_rows)} of the training "
        f"prompts; distill {distill_s:.0f} s ({'cached' if distill_s < 30 else 'distilled'})"
    )

    full_steps = None
    table = []
    for fraction in sorted(args.fractions):
        subset = prompt_subset(train_prompts, fraction)
        rows = torch.nonzero(torch.isin(data.prompt, torch.tensor(subset)))[:, 0]
        run = config
        if args.schedule == "steps":  # the recipe's step count on all rows, whatever the share
            run = replace(config, epochs=config.epochs * len(all_rows) / len(rows))
        head = EagleHead.from_target(target, seed=config.seed)
        log = train_head(head, data, rows, run, progress=False)
        held_m = measure(head, data, held_rows)
        entry = {
            "fraction": fraction,
            "prompts": len(subset),
            "rows": len(rows),
            "steps": log["steps"],
            "train_s": log["seconds"],
            **{f"held_{k}": v for k, v in held_m.items()},
        }
        if not args.no_probe:
            probe = prompt_subset(subset, min(1.0, 16 / len(subset)))
            probe_rows = torch.nonzero(torch.isin(data.prompt, torch.tensor(probe)) & data.greedy_rows())[:, 0]
            entry.update({f"probe_{k}": v for k, v in measure(head, data, probe_rows).items()})
        table.append(entry)
        if fraction == 1.0:
            full_steps = log["steps"]
        print(
            f"  share {fraction:.3f}: {len(subset)} prompts, {len(rows)} rows, {log['steps']} steps, "
            f"{log['seconds']:.0f} s, held-out top-1 d1 {held_m['top1_d1']:.3f}, tau_sparse {held_m['tau_sparse']:.3f}",
            flush=True,
        )

    print(
        f"\nEAGLE head learning curve ({'full' if args.full else 'quick'} recipe: "
        f"epochs={config.epochs:g} lr={config.lr:g} batch_rows={config.batch_rows} "
        f"p_weight={config.p_weight:g} noise={config.noise:g}; schedule={args.schedule}); "
        f"held-out: greedy rows of {len(held)} prompts, {table[0]['held_roots']} roots; tau bonus INCLUDED, "
        f"every position of the continuation (not a run's step roots)"
    )
    head_row = (
        f"{'share':>6} {'prompts':>7} {'rows':>6} {'steps':>5} {'train_s':>7} | {'held top-1 d1/d2/d3':>20} "
        f"{'top-5 d1/d2/d3':>20} {'tau sparse':>10} {'tau d6':>7}"
    )
    print(head_row + ("" if args.no_probe else f" | {'probe top-1 d1/d2/d3':>20} {'tau sparse':>10}"))
    for e in table:
        line = (
            f"{e['fraction']:6.3f} {e['prompts']:7d} {e['rows']:6d} {e['steps']:5d} {e['train_s']:7.0f} | "
            f"{e['held_top1_d1']:6.3f} {e['held_top1_d2']:6.3f} {e['held_top1_d3']:6.3f} "
            f"{e['held_top5_d1']:6.3f} {e['held_top5_d2']:6.3f} {e['held_top5_d3']:6.3f} "
            f"{e['held_tau_sparse']:10.3f} {e['held_tau_sparse_depth6']:7.3f}"
        )
        if not args.no_probe:
            line += (
                f" | {e['probe_top1_d1']:6.3f} {e['probe_top1_d2']:6.3f} {e['probe_top1_d3']:6.3f} "
                f"{e['probe_tau_sparse']:10.3f}"
            )
        print(line)
    last = table[-1]
    print(f"total {time.perf_counter() - t_start:.0f} s")
    print(
        f"rows={last['rows']} steps={full_steps if full_steps is not None else last['steps']} "
        f"distill_s={distill_s:.0f} heldout_top1_d1={last['held_top1_d1']:.3f} "
        f"heldout_top1_d2={last['held_top1_d2']:.3f} "
        f"heldout_top1_d3={last['held_top1_d3']:.3f} tau_proxy_sparse={last['held_tau_sparse']:.3f} "
        f"tau_proxy_sparse_depth6={last['held_tau_sparse_depth6']:.3f} "
        f"tau_proxy_sparse_smallest_share={table[0]['held_tau_sparse']:.3f}"
        + ("" if args.no_probe else f" probe_top1_d1={last['probe_top1_d1']:.3f}")
    )


if __name__ == "__main__":
    main()
