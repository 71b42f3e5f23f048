"""Verification on a CPU: the stock linear path against oneDNN on prepacked weights (`kernels.cpu_linear`).

Two parts, in this one process:

1. Per layer shape of the target (Qwen2.5-Coder-1.5B: q/o, k/v, gate/up, down, the LM head), as
   many copies as the model has (so the weights exceed every cache, as in a forward), the time of
   one pass over them for 1-64 rows with each way to run a float32 linear layer:
       stock        F.linear on the [out, in] weight (what nn.Linear does)
       transposed   F.linear on a weight stored transposed ([in, out] contiguous)
       onednn       torch.ops.mkldnn._linear_pointwise on the dense weight
       onednn_packed  the same on the weight prepacked once (`_reorder_linear_weight`, batch 16):
                    `kernels.cpu_linear.PackedLinear`
   with the implied bandwidth (weight bytes / time) and the largest relative difference from a
   float64 reference.
2. The model: one forward of 1, 2, 4, 8, 16, 32, 64 new tokens on a 256-token cache, stock and
   then packed in place (`pack_linears`), timed round-robin after a warm-up (median of repeats);
   bytes of weights read per forward (every Linear, the LM head included) and the implied
   bandwidth; then greedy equality on held Spec-Bench prompts: the packed model's plain greedy
   output and its speculative output (Qwen2.5-Coder-0.5B draft, packed too, tree --tree) against
   the stock model's plain greedy output, ties reported (`quality.compare_greedy`).

    python benchmarks/cpu_verify.py --quick     (~6 min here)
    python benchmarks/cpu_verify.py

Last line:
    verify16_over_decode=<a> stock_verify16_over_decode=<b> decode_speedup=<c> greedy_equal=<n>/<m>
a: the packed path's verify of root + a 16-node sparse tree (17 rows, tree mask: what notebook 01's
verify-cost curve times, `bench.verify_curve`) over its verify of the root alone; b: the same for the
stock path (the plain causal forwards of 1-64 tokens are in the table above it); c: stock 1-token
forward time over packed 1-token forward time; n/m: greedy outputs equal to the stock
model's plain greedy output (ties counted as not equal, and listed).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from specnb import Tree, autoregressive_generate, speculative_generate
from specnb.analysis.quality import compare_greedy, score
from specnb.bench.timing import measure_interleaved
from specnb.bench.verify_curve import prefilled_cache, verify_and_forward
from specnb.core.cache import crop
from specnb.core.drafting import ModelDrafter
from specnb.io.models import load_model, prompt_ids
from specnb.io.prompts import load_prompts
from specnb.kernels.cpu_linear import PACK_ROWS, linear_path, pack_linears

ROWS = (1, 2, 4, 8, 16, 32, 64)


def layer_shapes(config) -> dict[str, tuple[int, int, int]]:
    """name -> (out, in, copies in the model) of a Llama/Qwen2-style decoder."""
    h, layers = config.hidden_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    return {
        "q_proj/o_proj": (h, h, 2 * layers),
        "k_proj/v_proj": (kv, h, 2 * layers),
        "gate_proj/up_proj": (config.intermediate_size, h, 2 * layers),
        "down_proj": (h, config.intermediate_size, layers),
        "lm_head": (config.vocab_size, h, 1),
    }


def shape_table(config, rows: tuple[int, ...], repeats: int) -> list[dict]:
    out = []
    for name, (n, k, copies) in layer_shapes(config).items():
        out += shape_rows(name, n, k, copies, rows, repeats)  # its weights are freed on return
        print_shape(out, name)
    return out


def shape_rows(name: str, n: int, k: int, copies: int, rows: tuple[int, ...], repeats: int) -> list[dict]:
    """One layer shape's rows of `shape_table`: each way timed on `copies` random [n, k] weights."""
    out = []
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for _ in range(copies)]
    transposed = [w.t().contiguous().t() for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in weights]
    gb = copies * n * k * 4 / 1e9
    for m in rows:
        x = torch.randn(m, k)
        ways = {
            "stock": lambda: [F.linear(x, w) for w in weights],
            "transposed": lambda: [F.linear(x, w) for w in transposed],
            "onednn": lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in weights],
            "onednn_packed": lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in packed],
        }
        reference = [x.double() @ w.double().t() for w in weights[:4]]
        timings = measure_interleaved(ways, torch.device("cpu"), warmup=1, repeats=repeats)
        for way, fn in ways.items():
            got = fn()[:4]
            err = max(((a.double() - r).abs().max() / r.abs().max()).item() for a, r in zip(got, reference))
            ms = timings[way].median_s * 1e3
            out.append(
                {
                    "shape": f"{name} [{n}x{k}] x{copies}",
                    "rows": m,
                    "way": way,
                    "ms": ms,
                    "GB_per_s": gb / (ms / 1e3),
                    "max_rel_err": err,
                }
            )
    return out


def print_shape(table: list[dict], name: str) -> None:
    rows = [r for r in table if r["shape"].startswith(name)]
    ways = list(dict.fromkeys(r["way"] for r in rows))
    print(f"\n{rows[0]['shape']}: ms per pass over the copies (GB/s implied)")
    print("rows " + "".join(f"{w:>22}" for w in ways))
    for m in dict.fromkeys(r["rows"] for r in rows):
        cells = {r["way"]: r for r in rows if r["rows"] == m}
        print(f"{m:>4} " + "".join(f"{cells[w]['ms']:>12.1f} ({cells[w]['GB_per_s']:>5.1f})  " for w in ways))
    print(
        "largest relative error vs float64: "
        + ", ".join(f"{w} {max(r['max_rel_err'] for r in rows if r['way'] == w):.1e}" for w in ways),
        flush=True,
    )


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one forward reads: every Linear (packed or not), the LM head included."""
    total = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "PackedLinear":
            total += m.in_features * m.out_features * 4
    return total


def forward_curve(model: torch.nn.Module, prefix: int, rows: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Median seconds of one forward of n new tokens on a `prefix`-token cache, per n, round-robin."""
    cache = prefilled_cache(model, prefix)
    g = torch.Generator().manual_seed(0)
    ids = {n: torch.randint(0, model.config.vocab_size, (1, n), generator=g) for n in rows}

    def forward(n: int):
        @torch.inference_mode()
        def run() -> None:
            model(input_ids=ids[n], cache=cache, use_cache=True)

        return run

    reset = lambda: crop(cache, prefix)  # noqa: E731
    timings = measure_interleaved(
        {n: forward(n) for n in rows}, model.device, warmup=1, repeats=repeats, setups={n: reset for n in rows}
    )
    return {n: timings[n].median_s for n in rows}


def tree_verify(model: torch.nn.Module, prefix: int, nodes: int, repeats: int) -> dict[int, float]:
    """Median seconds of one `verification.verify` of the root alone (0) and of root + a sparse tree
    of `nodes` nodes under its tree mask, on a `prefix`-token cache: notebook 01's verify-cost curve
    (`bench.verify_curve`, kind "verify"), the same function."""
    cache = prefilled_cache(model, prefix)
    return {
        n: verify_and_forward(model, cache, Tree.preset("sparse", n), None, 1, repeats)["verify"].median_s
        for n in (0, nodes)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=6, help="held Spec-Bench prompts for greedy equality")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--tree", default="sparse:16")
    ap.add_argument(
        "--quick", action="store_true", help="3 repeats, 3 prompts x 24 tokens, shapes at 1, 2, 16, 64 rows"
    )
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.prompts, args.max_new_tokens = 3, 3, 24
    started = time.perf_counter()
    target, tokenizer = load_model(args.target, dtype="float32", device="cpu")
    print(
        f"target {args.target} float32, torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"oneDNN {torch.backends.mkldnn.is_available()}; load {time.perf_counter() - started:.0f} s",
        flush=True,
    )

    shape_table(target.config, (1, 2, 16, 64) if args.quick else ROWS, args.repeats)

    prompts = load_prompts("spec_bench", per_category=1, limit=args.prompts)
    ids = [prompt_ids(tokenizer, p.text) for p in prompts]
    stock_out = [autoregressive_generate(target, x, max_new_tokens=args.max_new_tokens).tokens for x in ids]
    stock = forward_curve(target, args.prefix, ROWS, args.repeats)
    stock_tree = tree_verify(target, args.prefix, 16, args.repeats)
    gb = weight_bytes(target) / 1e9
    packed_layers = pack_linears(target, "onednn")
    assert linear_path(target) == "onednn"
    fast = forward_curve(target, args.prefix, ROWS, args.repeats)
    fast_tree = tree_verify(target, args.prefix, 16, args.repeats)
    print(
        f"\nmodel forward of n new tokens on a {args.prefix}-token cache, median of {args.repeats} "
        f"({packed_layers} layers packed; {gb:.2f} GB of Linear weights read per forward)"
    )
    print(
        f"{'n':>3} {'stock ms':>9} {'GB/s':>6} {'/decode':>8} "
        f"{'onednn ms':>10} {'GB/s':>6} {'/decode':>8} {'speedup':>8}"
    )
    for n in ROWS:
        print(
            f"{n:>3} {stock[n] * 1e3:>9.0f} {gb / stock[n]:>6.1f} {stock[n] / stock[1]:>8.2f} "
            f"{fast[n] * 1e3:>10.0f} {gb / fast[n]:>6.1f} {fast[n] / fast[1]:>8.2f} {stock[n] / fast[n]:>8.2f}",
            flush=True,
        )
    print(
        f"verify of root + a 16-node sparse tree under its tree mask (17 rows, notebook 01's curve) over verify of "
        f"the root alone: stock {stock_tree[16] * 1e3:.0f} / {stock_tree[0] * 1e3:.0f} ms "
        f"= {stock_tree[16] / stock_tree[0]:.3f}, "
        f"onednn {fast_tree[16] * 1e3:.0f} / {fast_tree[0] * 1e3:.0f} ms = {fast_tree[16] / fast_tree[0]:.3f}",
        flush=True,
    )

    draft, _ = load_model(args.draft, dtype="float32", device="cpu", cpu_linear="onednn")
    shape, budget = args.tree.split(":")
    equal, total, notes = 0, 0, []
    for prompt, x, reference in zip(prompts, ids, stock_out):
        runs = {
            "plain": autoregressive_generate(target, x, max_new_tokens=args.max_new_tokens).tokens,
            args.tree: speculative_generate(
                target, ModelDrafter(draft), x, tree=Tree.preset(shape, int(budget)), max_new_tokens=args.max_new_tokens
            ).tokens,
        }
        for name, tokens in runs.items():
            verdict = compare_greedy(tokens, reference, score(target, x, tokens).margins)
            total += 1
            equal += verdict.verdict == "exact"
            if verdict.verdict != "exact":
                notes.append(
                    f"prompt {prompt.id} {name}: {verdict.verdict} at token {verdict.position} "
                    f"(the target's top-2 margin there {verdict.margin}, tie below {verdict.threshold})"
                )
    print(
        f"\ngreedy outputs of the packed model equal to the stock model's plain greedy output: {equal}/{total}"
        f" ({args.max_new_tokens} tokens, prompts {[p.id for p in prompts]})"
    )
    for note in notes:
        print("  " + note)
    print(f"total {time.perf_counter() - started:.0f} s")
    print(
        f"verify16_over_decode={fast_tree[16] / fast_tree[0]:.3f} "
        f"stock_verify16_over_decode={stock_tree[16] / stock_tree[0]:.3f} "
        f"decode_speedup={stock[1] / fast[1]:.3f} greedy_equal={equal}/{total}"
    )


if __name__ == "__main__":
    main()
