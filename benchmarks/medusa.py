"""Medusa-1 heads trained here on SmolLM2-135M: tau of Medusa's tree and of replayed shapes,
greedy exactness, and typical acceptance (LOSSY) against lossless sampling, on held-out prompts.

Spec-Bench prompts are split by id within each category (`medusa_training.split_prompts`: every
4th held out): heads train by self-distillation on the training part (heads cached under
~/.cache/specnb/medusa-heads by parameters, so a second run loads them); everything below is
measured on the first --test-prompts of the held-out part, taken from Spec-Bench's six tasks in
turn (MT-bench, translation, summarization, qa, math_reasoning, rag: Spec-Bench weights them
equally; the per-task tau is printed). Full mode also replays the same trees on a draft model
(SmolLM2's own first 24 layers) on the same prompts. Greedy, 64-node trees of depth <= K:
    medusa_tau       tau (tokens per target call, bonus INCLUDED) of real runs with Medusa's own
                     tree (its accuracy-greedy search on the training held-out split's per-rank
                     accuracy, ranks < 64), checked against the replay of the same tree
    best_shape_tau   the best replayed tau among preset shapes and Sequoia's tree at 64 nodes
    greedy_outputs_equal  prompts whose Medusa output equals the target's plain greedy output
    typical_tau, typical_ppl_ratio  typical acceptance (lossy) at temperature 0.7: tau, and the
                     perplexity (under the target) of its outputs over that of lossless sampling's

    python benchmarks/medusa.py --quick          (2 threads; --threads 1 beside another job)
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from specnb import Tree, autoregressive_generate, speculative_generate
from specnb.analysis.collect import collect
from specnb.analysis.collection import CollectConfig
from specnb.analysis.medusa_training import (
    TrainConfig, accuracy_by_depth, collect_heads, heldout_rank_accuracy, shape_trees, split_prompts, train_or_load,
)
from specnb.analysis.quality import perplexity
from specnb.analysis.replay import replay, replay_steps
from specnb.core.acceptance import TypicalAcceptance
from specnb.drafters.medusa import MedusaDrafter
from specnb.io.models import load_model, prompt_ids
from specnb.io.prompts import load_prompts, spec_bench_task
from specnb.notebook.medusa_study import budget_trees, tau_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer training and test prompts (< 10 min here)")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--test-prompts", type=int, default=None, help="held-out prompts measured (default 12 --quick, 24 full)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--draft-layers", type=int, default=None,
                    help="also replay the same trees on a draft model: the target's first N layers (default 24 full, 0 = none --quick)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (1 when another job shares the machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    target, tok = load_model(args.target)
    prompts = [(p.id, p.category, prompt_ids(tok, p.text)[0]) for p in load_prompts("spec_bench")]
    train, test = split_prompts(prompts, group=spec_bench_task)  # the test prompts: Spec-Bench's six tasks in turn
    n_test = args.test_prompts or (12 if args.quick else 24)
    draft_layers = args.draft_layers if args.draft_layers is not None else (0 if args.quick else 24)
    n_typ, max_new = (4, 64) if args.quick else (8, 64)
    # the recipe (medusa_training's module docstring): the greedy continuation and `samples` sampled
    # ones of each training prompt of <= 384 tokens (continuing long prompts is slow and, measured
    # here, did not help), soft labels from the target's own distribution, two residual blocks per
    # head, the frozen shared LM head
    train = [p for p in train if len(p[2]) <= 384]
    if args.quick:  # ~3 min of distillation and training on 2 threads
        train = train[:160]
        config = TrainConfig(num_heads=args.heads, max_new_tokens=96, gen_batch=40, samples=1, epochs=3, lr=3e-3,
                             num_layers=2, heldout=0.1)
    else:  # <= 15 min
        config = TrainConfig(num_heads=args.heads, max_new_tokens=160, gen_batch=48, samples=2, epochs=3, lr=3e-3,
                             num_layers=2, heldout=0.1)
    trained = train_or_load(target, args.target, [p for _, _, p in train], config)
    print(f"heads: {'loaded from cache' if trained.log['cached'] else 'trained'} ({trained.folder}); "
          f"distill {trained.log['distill_seconds']:.0f} s, train {trained.log['seconds']:.0f} s, "
          f"{trained.log['rows']} rows from {len(train)} prompts; CPU choices: share_lm_head={config.share_lm_head}, "
          f"loss_vocab={config.loss_vocab}, prompt_rows={config.prompt_rows}, soft_labels={config.soft_labels}, "
          f"num_layers={config.num_layers}, samples={config.samples} at T={config.sample_temperature}, "
          f"bfloat16 matmuls={trained.log.get('bfloat16')}")
    acc = heldout_rank_accuracy(trained.accuracy)
    trees = shape_trees(args.budget, args.heads, acc)
    tree = trees[("medusa", args.budget)]
    print(f"Medusa's tree from the training held-out split: {tree.describe()}")

    test = test[:n_test]
    t0 = time.perf_counter()
    collection = collect_heads(target, trained.heads, test, CollectConfig(max_new, top_k=args.budget, eos_token_id=()), tree=tree)
    runs = {p.prompt_id: p for p in collection.prompts}
    equal = 0
    for pid, _, ids in test:
        ref = autoregressive_generate(target, ids[None], max_new, eos_token_id=())
        equal += ref.tokens.tolist() == runs[pid].tokens.tolist()
    real_steps = np.concatenate([p.run_steps for p in collection.prompts])
    medusa_tau = real_steps[:, 3].sum() / len(real_steps)
    replayed = replay_steps(collection, tree)
    assert all([(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in replayed[p.prompt_id]]
               == [tuple(r) for r in p.run_steps.tolist()] for p in collection.prompts), "replay != real run"
    print(f"held-out: {len(test)} prompts x {max_new} tokens, collected in {time.perf_counter() - t0:.0f} s")
    by_task: dict[str, list] = {}
    for p in collection.prompts:
        by_task.setdefault(spec_bench_task(p.category), []).append(p.run_steps)
    print("Medusa's tree, real runs, tau (bonus INCLUDED) by Spec-Bench task: " + ", ".join(
        f"{t} {np.concatenate(s)[:, 3].sum() / sum(map(len, s)):.3f} ({len(s)} prompts)" for t, s in by_task.items()))
    print("per-head top-k accuracy by depth on the held-out continuations (head d = depth d):")
    print(accuracy_by_depth(collection).pivot(index="head", columns="k", values="top_k_accuracy").round(3).to_string())

    table = replay(collection, trees, mode="trajectory")
    print("replayed, greedy, trajectory (tau = bonus INCLUDED, acceptance_length = bonus EXCLUDED):")
    print(table[["shape", "budget", "nodes", "depth", "acceptance_rate", "acceptance_length", "tau"]].round(3).to_string(index=False))
    best = table[table["shape"] != "medusa"]["tau"].max()
    if draft_layers:
        draft = load_model(args.target, layers=draft_layers)[0]
        budgets = (8, 16, 32, args.budget)
        all_trees = budget_trees(budgets, args.heads, acc)
        with tempfile.TemporaryDirectory() as folder:
            draft_collection = collect(folder, target, draft, {pid: ids[None] for pid, _, ids in test},
                                       CollectConfig(max_new, top_k=args.budget, eos_token_id=()))
        taus = tau_table(collection, draft_collection, all_trees, f"draft model ({args.target}, {draft_layers} layers)")
        print("Medusa heads vs the draft model, the same trees replayed on the same prompts (greedy, trajectory, tau "
              "bonus INCLUDED):")
        print(taus.pivot_table(index="shape", columns=["drafter", "budget"], values="tau").round(3).to_string())

    drafter = MedusaDrafter(target, trained.heads)
    taus, ppl_typ, ppl_exact = [], [], []
    for pid, _, ids in test[:n_typ]:
        typ = speculative_generate(target, drafter, ids[None], tree, max_new, temperature=args.temperature,
                                   typical=TypicalAcceptance(), eos_token_id=(), seed=1)
        exact = speculative_generate(target, drafter, ids[None], tree, max_new, temperature=args.temperature,
                                     eos_token_id=(), seed=1)
        taus.append(sum(s.num_tokens for s in typ.steps) / len(typ.steps))
        ppl_typ.append(perplexity(target, ids, typ.tokens))
        ppl_exact.append(perplexity(target, ids, exact.tokens))
    typical_tau = float(np.mean(taus))
    ratio = float(np.exp(np.mean(np.log(ppl_typ)) - np.mean(np.log(ppl_exact))))
    print(f"typical_lossy at T={args.temperature}: tau {typical_tau:.3f}; perplexity (geometric mean over "
          f"{len(taus)} prompts) typical_lossy {np.exp(np.mean(np.log(ppl_typ))):.2f} vs lossless "
          f"{np.exp(np.mean(np.log(ppl_exact))):.2f}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    print(f"medusa_tau={medusa_tau:.3f} best_shape_tau={best:.3f} greedy_outputs_equal={equal}/{len(test)} "
          f"typical_tau={typical_tau:.3f} typical_ppl_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
