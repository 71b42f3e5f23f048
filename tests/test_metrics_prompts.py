import math
from pathlib import Path

import pytest
import torch

from specnb import GenerationResult, Step, steps_table, summarize, summary_table
from specnb.io.prompts import BUILTIN, default_spec_bench_path, load_prompts, read_jsonl


def result(steps, total=1.0, prefill=0.1):
    n = sum(s.num_tokens for s in steps)
    return GenerationResult(torch.zeros(n, dtype=torch.long), tuple(steps), 5, prefill, total, None)


def test_summary_hand_checked():
    # tree: root has 2 children; step 1 accepts rank 0 then rank 1 (+bonus); step 2 accepts nothing
    steps = [
        Step(0, 6, 2, 3, 0.01, 0.02, tree_depth=3, accepted_ranks=(0, 1), child_counts=(2, 2, 0)),
        Step(3, 6, 0, 1, 0.01, 0.02, tree_depth=3, accepted_ranks=(), child_counts=(2,)),
    ]
    s = summarize(result(steps, total=1.0, prefill=0.1))
    assert s.num_steps == 2 and s.num_tokens == 4 and s.num_drafted == 12 and s.num_accepted == 2
    assert s.acceptance_rate == pytest.approx(2 / 12)
    assert s.acceptance_length == pytest.approx(1.0)  # bonus excluded
    assert s.tau == pytest.approx(2.0)  # bonus included
    assert s.depth_acceptance == pytest.approx((0.5, 0.5, 0.0))
    # rank 0: visits = root(step1), node(step1), root(step2) = 3, hits 1; rank 1: same visits, hit 1
    assert s.rank_acceptance == pytest.approx((1 / 3, 1 / 3))
    assert s.ttft_s == pytest.approx(0.1 + 0.03)
    assert s.tpot_s == pytest.approx((1.0 - 0.13) / 3)
    assert s.tokens_per_s == pytest.approx(4.0)
    assert s.peak_memory_bytes is None


def test_tables_are_tidy():
    steps = [Step(0, 4, 1, 2, 0.0, 0.0, tree_depth=4, accepted_ranks=(0,), child_counts=(1, 1))]
    table = steps_table({"a": result(steps), "b": result(steps)})
    assert len(table) == 2 and set(table["run"]) == {"a", "b"}
    assert {"num_drafted", "num_accepted", "accepted_ranks", "verify_time"} <= set(table.columns)
    pooled = summary_table({"shape": [result(steps), result(steps)]})
    row = pooled.iloc[0]
    assert row["num_runs"] == 2 and row["tau"] == pytest.approx(2.0)
    assert row["depth_1_acceptance"] == 1.0 and math.isclose(row["rank_0_acceptance"], 0.5)


def test_builtin_prompts_span_categories():
    assert len({p.category for p in BUILTIN}) >= 10
    assert len({p.id for p in BUILTIN}) == len(BUILTIN)
    few = load_prompts("builtin", limit=4)
    assert len({p.category for p in few}) == 4


def test_jsonl_reader(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(
        '{"question_id": 1, "category": "a", "turns": ["x?", "y"]}\n'
        '{"question_id": 2, "category": "a", "turns": ["z?"]}\n'
        '{"question_id": 3, "category": "b", "turns": ["w?"]}\n'
    )
    assert [p.text for p in read_jsonl(f)] == ["x?", "z?", "w?"]
    assert [p.id for p in load_prompts(f, per_category=1)] == ["1", "3"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_jsonl(bad)


@pytest.mark.skipif(
    default_spec_bench_path() is None,
    reason="Spec-Bench question.jsonl not found (../shared is the project's CI layout; a user's clone has none)",
)
def test_spec_bench_file():
    prompts = load_prompts("spec_bench")
    assert len(prompts) == 480
    assert len({p.category for p in prompts}) == 13
    assert len(load_prompts("spec_bench", per_category=2)) == 26


def test_node_frequency_reads_steps_back_from_csv(tmp_path):
    """Empty paths come back from CSV as NaN and one-rank paths as numbers; both must parse."""
    import pandas as pd

    from specnb import Tree
    from specnb.notebook.experiments import node_frequency

    tree = Tree.from_paths([(0,), (1,), (0, 0)])
    steps = pd.DataFrame({"accepted_ranks": ["", "0", "0/0", "1"]})
    steps.to_csv(tmp_path / "steps.csv", index=False)
    for frame in (steps, pd.read_csv(tmp_path / "steps.csv"), pd.DataFrame({"accepted_ranks": ["", "0"]})):
        freq = node_frequency(frame, tree)
        assert set(freq) == set(tree.paths)
    freq = node_frequency(pd.read_csv(tmp_path / "steps.csv"), tree)
    assert freq == {(0,): 0.5, (1,): 0.25, (0, 0): 0.25}

