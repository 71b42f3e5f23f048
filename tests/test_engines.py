"""Each serving engine's rules, re-implemented here from the engine's own source (file and commit in
each test), against specnb's lines (`io.engines`): a line is given only where the engine drafts
exactly the tree specnb verified, and otherwise the entry says why. The example is the tree a cpu main
job once recommended with a vLLM line vLLM cannot draft: kary3 at 8 nodes."""

import ast
import itertools
import random

import pytest

from specnb.core.trees import Tree
from specnb.io.engines import (
    CHOICES_TOPK,
    ENGINES,
    choices_line,
    deploy_lines,
    level_widths,
    llama_cpp_line,
    sglang_flags,
    trtllm_line,
    vllm_line,
)

KARY3_8 = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)])
PRESETS = [Tree.preset(s, n) for s in ("chain", "kary2", "kary3", "wide", "beams2", "sparse") for n in (1, 2, 4, 8, 16)]


def random_trees(count: int = 60, seed: int = 0) -> list[Tree]:
    """Gap-free trees grown by adding a random node's next child."""
    rng, out = random.Random(seed), []
    for _ in range(count):
        paths = [(0,)]
        for _ in range(rng.randint(0, 14)):
            parent = rng.choice([(), *paths])
            kids = [p for p in paths if p[:-1] == parent and len(p) == len(parent) + 1]
            paths.append((*parent, len(kids)))
        out.append(Tree.from_paths(paths))
    return out


def vllm_drafted_paths(tree_string: str) -> list[tuple[int, ...]]:
    """The paths vLLM's EAGLE proposer drafts for a speculative_token_tree: vllm/config/speculative.py
    (commit f19b16d) sorts the literal by (len, path); vllm/v1/spec_decode/eagle.py (commit 008603a,
    EagleProposer.__init__) sets child_drafts_per_level[level] = num_drafts_per_level[level] //
    num_drafts_per_level[level - 1], and propose_tree drafts that many top children (torch.topk) under
    EVERY node of the previous level, whatever ranks the paths hold."""
    choices = sorted(ast.literal_eval(tree_string), key=lambda t: (len(t), t))
    per_level = [sum(1 for c in choices if len(c) == d) for d in range(1, len(choices[-1]) + 1)]
    children = [per_level[0]] + [per_level[i] // per_level[i - 1] for i in range(1, len(per_level))]
    level, drafted = [()], []
    for k in children:
        level = [p + (r,) for p in level for r in range(k)]
        drafted += level
    return drafted


@pytest.mark.parametrize("tree", [KARY3_8, *PRESETS, *random_trees()], ids=lambda t: str(t.num_nodes))
def test_a_vllm_line_is_given_exactly_where_vllm_drafts_the_tree_it_verifies(tree):
    line = vllm_line(tree)
    if line.line is None:
        assert "branching" in line.note and "not" in line.note
        assert sorted(vllm_drafted_paths(str([tuple(p) for p in tree.paths]))) != sorted(tree.paths)
        assert level_widths(tree) is None
        return
    config = ast.literal_eval(line.line.removeprefix("speculative_config="))
    parsed = ast.literal_eval(config["speculative_token_tree"])
    assert parsed == sorted(parsed, key=lambda t: (len(t), t)) == list(tree.paths)  # vLLM's own order
    assert config["num_speculative_tokens"] == len(parsed) == tree.num_nodes  # as vLLM's tests set it
    assert vllm_drafted_paths(config["speculative_token_tree"]) == list(tree.paths)
    assert Tree.from_branching(level_widths(tree)) == tree


def test_the_tree_a_main_job_recommended_gets_no_vllm_line():
    """kary3:8: depth-1 nodes with 3, 2 and 0 children. vLLM would draft 3 + 3 x (5 // 3) = 6 tokens
    against a mask of 8 paths."""
    assert len(vllm_drafted_paths(str([tuple(p) for p in KARY3_8.paths]))) == 6
    line = vllm_line(KARY3_8)
    assert line.line is None and "not accepted" in line.text()
    assert vllm_line(Tree.from_branching([3, 2])).line is not None  # a product tree is


def sglang_pool(steps: int, topk: int) -> int:
    """The draft nodes SGLang's EAGLE worker can choose num-draft-tokens - 1 from: the root's top-k,
    then steps - 1 expansions of the k kept frontier nodes by their top-k each
    (python/sglang/srt/speculative/spec_utils.py, _select_top_k_tokens_later, commit 00731f0;
    eagle_utils.py organize_draft_results, commit 003ddbc: torch.topk(score_list, num_draft_token - 1))."""
    return topk + (steps - 1) * topk * topk


@pytest.mark.parametrize("tree", [KARY3_8, *PRESETS, *random_trees(seed=1)], ids=lambda t: str(t.num_nodes))
def test_sglang_flags_are_ones_sglang_can_grow(tree):
    flags = sglang_flags(tree)
    steps, topk, tokens = (
        flags["speculative_num_steps"],
        flags["speculative_eagle_topk"],
        flags["speculative_num_draft_tokens"],
    )
    assert steps == tree.depth and topk >= 1
    assert 2 <= tokens <= sglang_pool(steps, topk) + 1  # the root counted; topk over the pool fails there
    if topk == 1:  # SGLang adjusts num-draft-tokens to steps + 1 (arg_groups/speculative_hook.py, commit 004c82e)
        assert tokens == steps + 1
    line = ENGINES["sglang"](tree)
    assert "not this shape" in line.note and f"--speculative-num-draft-tokens {tokens}" in line.line


def test_sglang_flags_of_a_deep_wide_tree_stay_within_what_it_can_grow():
    tree = Tree.from_branching([3, 3, 3])  # 39 nodes; SGLang's pool at steps 3, topk 3 is 3 + 2 x 9 = 21
    assert sglang_flags(tree)["speculative_num_draft_tokens"] == 22


@pytest.mark.parametrize("tree", [KARY3_8, *PRESETS], ids=lambda t: str(t.num_nodes))
def test_choices_and_tensorrt_llm_lines_load_as_those_engines_read_them(tree):
    """Medusa (medusa/model/utils.py, commit e2a5d20) and EAGLE-1 (eagle/model/utils.py, v1 branch,
    commit 4a9cf3a) sort by (len, path), find each path's parent with list.index (a missing prefix
    raises) and draft each node's top TOPK = 10; TensorRT-LLM (tensorrt_llm/llmapi/llm_args.py,
    check_eagle_choices, commit 0004396) sorts, asserts every choice's prefix is present and sets
    max_total_draft_tokens = len(choices)."""
    line = choices_line(tree)
    choices = tree.to_choices()
    if line.line is None:  # wide:16: ranks up to 15, beyond each node's top 10
        assert max(r for c in choices for r in c) >= CHOICES_TOPK and "top 10" in line.note
    else:
        assert ast.literal_eval(line.line) == choices and all(r < CHOICES_TOPK for c in choices for r in c)
    assert choices == sorted(choices, key=lambda x: (len(x), x)) and all(
        c[:-1] in choices for c in choices if len(c) > 1
    )
    trt = trtllm_line(tree)
    assert trt.line == f"EagleDecodingConfig(eagle_choices={choices!r})"


def test_choices_refused_where_medusa_and_eagle1_cannot_draft_them():
    assert choices_line(Tree.wide(11)).line is None and "top 10" in choices_line(Tree.wide(11)).note
    assert (
        choices_line(Tree.chain(5), heads=4).line is None
        and "4 Medusa heads" in choices_line(Tree.chain(5), heads=4).note
    )
    assert choices_line(Tree.chain(4), heads=4).line is not None


def test_llama_cpp_takes_chains_only():
    """llama.cpp's server drafts a greedy chain (common/speculative.cpp, commit 001d906) and verifies
    it as one sequence (common/sampling.cpp common_sampler_sample_and_accept_n)."""
    assert llama_cpp_line(Tree.chain(4)).line == "--draft-max 4"
    tree = Tree.from_branching([2, 1])
    line = llama_cpp_line(tree)
    assert line.line is None and "chains only" in line.note and f"--draft-max {tree.depth}" in line.note


def test_every_engine_answers_for_every_tree_and_says_why_not():
    for tree in itertools.chain(PRESETS, random_trees(seed=2), [KARY3_8]):
        lines = deploy_lines(tree)
        assert list(lines) == list(ENGINES)
        for name, line in lines.items():
            assert line.engine == name and line.note
            assert line.text() == (line.line if line.line is not None else f"not accepted: {line.note}")
