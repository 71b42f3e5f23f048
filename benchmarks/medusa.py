"""Medusa-1 heads trained here on SmolLM2-135M: tau of Medusa's tree and of replayed shapes,
greedy exactness, and typical acceptance (LOSSY) against lossless sampling, on held-out prompts.

Spec-Bench prompts (short ones: <= --max-prompt-tokens through the chat template) are split by id
(`medusa_training.split_prompts`): heads train by self-distillation on one part (heads cached under
~/.cache/specnb/medusa-heads by parameters, so a second run loads them), everything below is
measured on the other part. Greedy, 64-node trees of depth <= K:
    medusa_tau       tau (tokens per target call, bonus INCLUDED) of real runs with Medusa's own
                     tree (its accuracy-greedy search on the training held-out split's per-rank
                     accuracy), checked against the replay of the same tree
    best_shape_tau   the best replayed tau among preset shapes and Sequoia's tree at 64 nodes
    greedy_outputs_equal  prompts whose Medusa output equals the target's plain greedy output
    typical_tau, typical_ppl_ratio  typical acceptance (lossy) at temperature 0.7: tau, and the
                     perplexity (under the target) of its outputs over that of lossless sampling's

    OMP_NUM_THREADS=1 python benchmarks/medusa.py --quick
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from specnb import Tree, autoregressive_generate, speculative_generate
from specnb.analysis.collection import CollectConfig
from specnb.analysis.medusa_training import (
    TrainConfig, accuracy_by_depth, collect_heads, heldout_rank_accuracy, shape_trees, split_prompts, train_or_load,
)
from specnb.analysis.quality import perplexity
from specnb.analysis.replay import replay, replay_steps
from specnb.core.acceptance import TypicalAcceptance
from specnb.drafters.medusa import MedusaDrafter
from specnb.io.models import load_model, prompt_ids
from specnb.io.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer training and test prompts (< 10 min here)")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=None, help="default 128 (--quick), 256 (full)")
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    target, tok = load_model(args.target)
    prompts = [(p.id, p.category, prompt_ids(tok, p.text)[0]) for p in load_prompts("spec_bench")]
    max_prompt = args.max_prompt_tokens or (128 if args.quick else 256)
    prompts = [p for p in prompts if len(p[2]) <= max_prompt]
    train, test = split_prompts(prompts)
    n_test, n_typ, max_new = (10, 4, 64) if args.quick else (16, 8, 64)
    if args.quick:  # ~4 min of distillation and training: the frozen shared LM head, residual blocks only
        config = TrainConfig(num_heads=args.heads, max_new_tokens=96, epochs=4, lr=3e-3)
    else:  # <= 15 min: more and longer continuations, a trained projection per head (Medusa-1's heads)
        config = TrainConfig(num_heads=args.heads, max_new_tokens=160, gen_batch=32, epochs=3, lr=3e-3,
                             share_lm_head=False)
    trained = train_or_load(target, args.target, [p for _, _, p in train], config)
    print(f"heads: {'loaded from cache' if trained.log['cached'] else 'trained'} ({trained.folder}); "
          f"distill {trained.log['distill_seconds']:.0f} s, train {trained.log['seconds']:.0f} s, "
          f"{trained.log['rows']} rows; CPU choices: share_lm_head={config.share_lm_head}, loss_vocab={config.loss_vocab}")
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
    print("per-head top-k accuracy by depth on the held-out continuations (head d = depth d):")
    print(accuracy_by_depth(collection).pivot(index="head", columns="k", values="top_k_accuracy").round(3).to_string())

    table = replay(collection, trees, mode="trajectory")
    print("replayed, greedy, trajectory (tau = bonus INCLUDED, acceptance_length = bonus EXCLUDED):")
    print(table[["shape", "budget", "nodes", "depth", "acceptance_rate", "acceptance_length", "tau"]].round(3).to_string(index=False))
    best = table[table["shape"] != "medusa"]["tau"].max()

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
