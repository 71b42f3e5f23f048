"""Each serving engine's setting for a pair, chosen by replay and scored held out, and set against the
best tree of all on the same prompts. Each engine's rule, the file and commit it was read from, and
the releases that carry it: docs/engines.md.

    RELEASES      per engine setting: its releases, and what it is
    static_trees  the engines that take a static tree drafted as verified (vLLM 0.10.1-0.20.x product
                  trees, TensorRT-LLM's eagle_choices (deprecated), Medusa / EAGLE-1 choices, llama.cpp's
                  server chain): the fastest row of `heldout.choose`'s table each takes, with its line
    vllm_chain    current vLLM (0.21 on): EAGLE, EAGLE-3, MTP and a draft model draft a chain of
                  num_speculative_tokens; the fastest chain, its line
    grown_tree    SGLang's and TensorRT-LLM's dynamic trees: every flag setting the engine accepts, replayed
                  by its own rule from the super-trees (`replay.replay_sglang`), the flags of highest tau
                  chosen on each fold's training prompts and scored on the fold (held out), priced by the
                  measured curves
    engine_table  one row per engine and release range: the setting, its held-out tau [95%], its expected
                  speed-up [95%], and the difference of speed-up against the best tree of all (`heldout.
                  choose`'s first row) on the prompts both answer, with its paired interval: "tied" where
                  it holds 0, else "behind" (or "ahead": a grown tree can beat every static one)

Pure: tables in, tables out; no model, no disk. tau includes the bonus token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..core.trees import Tree
from ..io.engines import ENGINES, trtllm_dynamic_line
from . import replay, spread
from .collection import Collection
from .cost_model import step_cost
from .heldout import PAYS, HeldOut, by_prompt, folds, pooled_tau, quartile_costs, scored_rows

STATIC_ENGINES = ("vllm", "tensorrt_llm", "medusa_eagle1", "llama_cpp")  # they take a static tree
GROWN = ("sglang", "tensorrt_llm_dynamic")  # they grow their own tree every step from a few flags
RELEASES = {  # setting -> (engine as a reader names it, releases, what it takes)
    "vllm_chain": ("vLLM", "0.21 on (current)", "a chain: num_speculative_tokens"),
    "vllm": ("vLLM", "0.10.1 to 0.20.x", "a product tree: speculative_token_tree (removed in 0.21)"),
    "tensorrt_llm_dynamic": ("TensorRT-LLM", "PyTorch backend, 2026 on", "a dynamic tree: four flags"),
    "tensorrt_llm": ("TensorRT-LLM", "to 1.3 (deprecated, removed in 1.4)", "a static tree: eagle_choices"),
    "sglang": ("SGLang", "current", "a dynamic tree: three flags"),
    "medusa_eagle1": ("Medusa / EAGLE-1", "their repositories", "a static tree: choices"),
    "llama_cpp": ("llama.cpp server", "current", "a chain: --draft-max"),
}
RULES = {  # each engine's rule in a line (the files and commits it was read from: docs/engines.md)
    "sglang": "SGLang's EAGLE tree: the root's top-k, then num-steps - 1 levels keeping the k best of the frontier's "
    "top-k children, the num-draft-tokens - 1 best of that pool verified",
    "tensorrt_llm_dynamic": "TensorRT-LLM's EAGLE-2 dynamic tree: SGLang's rule, max_draft_len levels of "
    "dynamic_tree_max_topK, the max_total_draft_tokens best verified, in [max_draft_len, topK x max_draft_len]",
}


def static_trees(speed: pd.DataFrame, trees: Mapping[tuple[str, int], Tree]) -> pd.DataFrame:
    """For each engine that takes a static tree (`io.engines`), the fastest row of `speed` (`choose`:
    expected tokens/s with held-out tau) whose tree the engine drafts as verified, its line, and what
    it gives up against the fastest row of all (speed-up and expected tau); a row with no shape where
    the engine takes none of the trees; then current vLLM's chain ("vllm_chain", `vllm_chain`)."""
    ranked = speed.sort_values("tokens_per_s", ascending=False) if len(speed) else speed
    rows = []
    for engine in STATIC_ENGINES:
        row: dict = {"engine": engine}
        for r in ranked.itertuples():
            line = ENGINES[engine](trees[(r.shape, int(r.budget))])
            if line.line is None:
                continue
            best = ranked.iloc[0]
            row |= {
                "shape": r.shape,
                "budget": int(r.budget),
                "expected_tau": float(r.expected_tau),
                "tau_ci_low": float(r.tau_ci_low),
                "tau_ci_high": float(r.tau_ci_high),
                "speedup": float(r.speedup),
                "speedup_ci_low": float(r.speedup_ci_low),
                "speedup_ci_high": float(r.speedup_ci_high),
                "verdict": r.verdict,
                "speedup_given_up": float(best["speedup"]) - float(r.speedup),
                "tau_given_up": float(best["expected_tau"]) - float(r.expected_tau),
                "line": line.line,
            }
            break
        rows.append(row)
    chain = vllm_chain(speed)
    if len(chain):  # current vLLM: a chain, beside the releases that take a product tree
        best = ranked.iloc[0]
        r = chain.iloc[0]
        rows.append(
            {
                "engine": "vllm_chain",
                "shape": "chain",
                "budget": int(r["budget"]),
                **{k: float(r[k]) for k in ("expected_tau", "tau_ci_low", "tau_ci_high", "speedup")},
                **{k: float(r[k]) for k in ("speedup_ci_low", "speedup_ci_high")},
                "verdict": r["verdict"],
                "speedup_given_up": float(best["speedup"]) - float(r["speedup"]),
                "tau_given_up": float(best["expected_tau"]) - float(r["expected_tau"]),
                "line": r["line"],
            }
        )
    return pd.DataFrame(rows)


def vllm_chain(speed: pd.DataFrame) -> pd.DataFrame:
    """Current vLLM drafts a chain of num_speculative_tokens (EAGLE, EAGLE-3, MTP, a draft model): the
    fastest chain of `speed`, with its line; empty where no chain was priced."""
    chains = speed[speed["shape"] == "chain"].sort_values("tokens_per_s", ascending=False)
    if chains.empty:
        return pd.DataFrame()
    r = chains.iloc[0]
    line = (
        f"speculative_config={{'method': 'draft_model', 'model': DRAFT, 'num_speculative_tokens': {int(r['budget'])}}}"
    )
    return chains.head(1).assign(engine="vllm_chain", line=line + "  (EAGLE/EAGLE-3/MTP: the same key)")


def grown_tree(
    engine: str,
    collection: Collection,
    budgets: Sequence[int],
    curve: pd.DataFrame,
    target: str,
    draft: str,
    k: int = 3,
    seed: int = 0,
) -> pd.DataFrame:
    """SGLang's three flags, or TensorRT-LLM's dynamic tree's (`engine` "sglang" or
    "tensorrt_llm_dynamic"), per budget, chosen by replaying the engine's own tree rule (`RULES`,
    `replay.replay_sglang`) on the prompts collected with super-trees: every flag setting the engine
    accepts at that budget, the flags of highest tau chosen on all prompts (what to deploy), and the
    choice held out (made on each fold's training prompts, scored on the fold; `heldout.folds`) for its
    tau and 95% interval. The expected speed-up prices a step as the draft's forwards (the root's, then
    depth - 1 of topk tokens) plus the target's verify of budget nodes, from the measured curves, the
    interval as `heldout.choose`'s. One row per budget, with the engine's line; the held-out per-prompt
    counts in attrs["per_prompt"] (budget, prompt_id, tokens, steps), the flags too large for the
    super-trees in attrs["skipped"]."""
    if collection.config.cross_tokenizer or not collection.has_super_trees:
        return pd.DataFrame()  # no draft ranks of the target's tokens, or no super-trees collected
    sup = collection.super_tree_prompts()
    grid = replay.sglang_flags if engine == "sglang" else replay.trtllm_flags
    flags = grid(sup.config.super_k, sup.config.super_depth, budgets)
    per = replay.replay_sglang(sup, flags, mode="trajectory", per_prompt=True, engine=engine)
    if per.empty:
        return pd.DataFrame()
    ids = [p.prompt_id for p in sup.prompts]
    splits = folds(ids, k, seed)
    cost = step_cost(curve, target, draft)
    fast, slow = quartile_costs(curve, target, draft)
    t_step = lambda c, steps, topk, n: (  # noqa: E731
        c.t_draft_width(1) + (steps - 1) * c.t_draft_width(topk) + c.t_verify(n)
    )
    rows, held_out = [], []
    for n, mine in per.groupby("budget", sort=True):
        taus = mine.groupby("shape")[["tokens", "steps"]].sum()
        best = (taus["tokens"] / taus["steps"]).idxmax()
        held = []
        for test in splits:
            train = mine[~mine["prompt_id"].isin(test)].groupby("shape")[["tokens", "steps"]].sum()
            chosen = (train["tokens"] / train["steps"]).idxmax() if len(train) else best
            held.append(mine[(mine["shape"] == chosen) & mine["prompt_id"].isin(test)])
        held_rows = by_prompt(pd.concat(held) if held else mine[mine["shape"] == best], ids)
        held_out.append(held_rows.reset_index().assign(budget=int(n)))
        tau = pooled_tau(held_rows) if splits else float("nan")
        low, high = spread.ratio_interval(held_rows["tokens"], held_rows["steps"]) if tau == tau else (np.nan, np.nan)
        row = mine[mine["shape"] == best].iloc[0]
        steps, topk = int(row["num_steps"]), int(row["topk"])
        median = t_step(cost, steps, topk, n)
        rows.append(
            {
                "engine": engine,
                "budget": int(n),
                "num_steps": steps,
                "topk": topk,
                "num_draft_tokens": int(n) + 1,
                "tau_in_sample": float(taus.loc[best, "tokens"] / taus.loc[best, "steps"]),
                "tau_heldout": tau,
                "tau_heldout_ci_low": low,
                "tau_heldout_ci_high": high,
                "flags_tried": len(taus),
                "prompts": len(ids),
                "t_step_s": median,
                "speedup": tau * cost.t_verify(0) / median,
                "speedup_ci_low": low * fast.t_verify(0) / t_step(slow, steps, topk, n),
                "speedup_ci_high": high * slow.t_verify(0) / t_step(fast, steps, topk, n),
                "line": _grown_line(engine, steps, topk, int(n)),
            }
        )
    out = pd.DataFrame(rows)
    out["verdict"] = [spread.verdict(lo, hi, PAYS) for lo, hi in zip(out["speedup_ci_low"], out["speedup_ci_high"])]
    out.attrs["skipped"] = per.attrs.get("skipped", [])
    out.attrs["per_prompt"] = pd.concat(held_out, ignore_index=True)
    return out


def _grown_line(engine: str, steps: int, topk: int, n: int) -> str:
    if engine == "sglang":
        return f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} --speculative-num-draft-tokens {n + 1}"
    return trtllm_dynamic_line(steps, topk, n)


def engine_table(
    held: HeldOut,
    speed: pd.DataFrame,
    trees: Mapping[tuple[str, int], Tree],
    grown: Mapping[str, pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """One row per engine setting (`RELEASES`' order): its line, held-out tau [95%], expected speed-up
    [95%], and the difference of its speed-up from the best tree of all (`speed`'s first row), paired
    on the prompts both answer (each prompt's held-out tokens per target call priced by each tree's
    cost factor, `spread.paired_difference`): "tied" where the interval holds 0, else "behind" or
    "ahead"; the best tree itself "the best tree". grown: `grown_tree`'s table per engine (its fastest
    budget taken). A setting no tree fits says why in "line"."""
    if speed.empty:
        return pd.DataFrame()
    best = speed.iloc[0]
    best_key = (str(best["shape"]), int(best["budget"]))
    best_rows = scored_rows(held, *best_key).groupby("prompt_id")[["tokens", "steps"]].sum()
    best_factor = float(best["speedup"]) / float(best["expected_tau"])
    settings = {r["engine"]: r for _, r in static_trees(speed, trees).iterrows()}
    for engine, table in (grown or {}).items():
        if len(table):
            settings[engine] = table.sort_values("speedup", ascending=False).iloc[0]
    rows = []
    for key, (name, releases, takes) in RELEASES.items():
        r = settings.get(key)
        row = {"setting": key, "engine": name, "releases": releases, "takes": takes}
        if r is None or "budget" not in r or r.get("budget") != r.get("budget"):
            rows.append(row | {"line": "no tree of this pair's fits it (see deploy.txt)"})
            continue
        if key in GROWN:
            mine = grown[key].attrs["per_prompt"]
            mine = mine[mine["budget"] == int(r["budget"])].set_index("prompt_id")[["tokens", "steps"]]
            tau, low_tau, high_tau = r["tau_heldout"], r["tau_heldout_ci_low"], r["tau_heldout_ci_high"]
            factor = float(r["speedup"]) / float(tau) if tau == tau and tau else float("nan")
            shape = f"{r['num_steps']}x{r['topk']}"
        else:
            shape = str(r["shape"])
            mine = scored_rows(held, shape, int(r["budget"])).groupby("prompt_id")[["tokens", "steps"]].sum()
            tau, low_tau, high_tau = r["expected_tau"], r.get("tau_ci_low", np.nan), r.get("tau_ci_high", np.nan)
            factor = float(r["speedup"]) / float(tau)
        both = mine.index.intersection(best_rows.index)
        diff, low, high = float(r["speedup"]) - float(best["speedup"]), float("nan"), float("nan")
        if len(both) and factor == factor:
            a, b = mine.loc[both], best_rows.loc[both]
            diff, low, high = spread.paired_difference(
                a["tokens"] * factor, a["steps"], b["tokens"] * best_factor, b["steps"]
            )
        same = key not in GROWN and (shape, int(r["budget"])) == best_key
        verdict = "the best tree" if same else _against(low, high)
        rows.append(
            row
            | {
                "shape": shape,
                "budget": int(r["budget"]),
                "tau_heldout": float(tau),
                "tau_ci_low": float(low_tau),
                "tau_ci_high": float(high_tau),
                "speedup": float(r["speedup"]),
                "speedup_ci_low": float(r["speedup_ci_low"]),
                "speedup_ci_high": float(r["speedup_ci_high"]),
                "versus_best": diff,
                "versus_best_ci_low": low,
                "versus_best_ci_high": high,
                "prompts_compared": len(both),
                "verdict": verdict,
                "line": r["line"],
            }
        )
    return pd.DataFrame(rows)


def _against(low: float, high: float) -> str:
    if low != low:
        return "cannot tell"
    return "tied" if spread.tie(low, high) else ("behind" if high < 0 else "ahead")
