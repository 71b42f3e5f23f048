import math
from pathlib import Path

import pytest
import torch

from specnb import GenerationResult, Step, steps_table, summarize, summary_table
from specnb.io.prompts import (
    BUILTIN,
    SPEC_BENCH_SHA256,
    PromptRequestError,
    describe_prompts,
    load_prompts,
    read_jsonl,
    spec_bench_digest,
    spec_bench_file,
)


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


def test_spec_bench_ships_with_the_package():
    """Spec-Bench's 480 prompts are package data (importlib.resources), unchanged, with their
    licence and a notice naming the source: a clone, a pip install and Colab all read the same file."""
    assert spec_bench_digest() == SPEC_BENCH_SHA256
    folder = spec_bench_file().parent
    assert "Apache License" in folder.joinpath("LICENSE").read_text()
    notice = folder.joinpath("NOTICE").read_text()
    assert "hemingkx/Spec-Bench" in notice and "fd2c1cd7d2201ef71db4c5f4e455008f017967bf" in notice
    prompts = load_prompts("spec_bench")
    assert len(prompts) == 480 and len({p.id for p in prompts}) == 480
    summary = describe_prompts(prompts, "spec_bench")
    assert summary.count == 480 and len(summary.per_category) == 13
    assert dict(summary.per_category)["coding"] == 10 and dict(summary.per_category)["rag"] == 80
    assert len(load_prompts("spec_bench", per_category=2)) == 26
    assert load_prompts() == prompts, "Spec-Bench is the default source"


def test_prompt_requests_that_cannot_be_filled_are_refused():
    with pytest.raises(
        PromptRequestError, match=r"max_prompts=6.*give only 2 \(writing 1, coding 1\).*lower max_prompts to 2"
    ):
        load_prompts("builtin", per_category=3, categories=["coding", "writing"], limit=6)
    with pytest.raises(PromptRequestError, match=r"no category \['poetry'\]; they have \['writing'"):
        load_prompts("spec_bench", categories=["coding", "poetry"])
    with pytest.raises(PromptRequestError, match="'auto' is gone.*'spec_bench'.*'builtin'"):
        load_prompts("auto")
    with pytest.raises(FileNotFoundError, match="named sources: spec_bench, builtin"):
        load_prompts("no/such/file.jsonl")
    fits = load_prompts("spec_bench", per_category=3, categories=["coding", "writing"], limit=6)
    assert describe_prompts(fits, "spec_bench").per_category == (("writing", 3), ("coding", 3))
    line = describe_prompts(fits, "spec_bench").line()
    assert line == "prompts: Spec-Bench (shipped with specnb), 6 prompts (writing 3, coding 3)"


def test_nothing_in_the_project_reads_shared_beside_it():
    """A user's clone has no `shared` folder beside it: no code, notebook, script or test may reach for it."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    pattern = "[.][.]/" + "shared|shared/" + "data"  # written apart so this file does not match itself
    found = subprocess.run(
        [
            "git",
            "-C",
            str(root),
            "grep",
            "-n",
            "-E",
            pattern,
            "--",
            "specnb",
            "notebooks",
            "benchmarks",
            "scripts",
            "tests",
            "run_notebooks.sh",
            "run_tests.sh",
            ".ci",
        ],
        capture_output=True,
        text=True,
    )
    if found.returncode == 128:
        pytest.skip(f"not a git checkout: {found.stderr.strip()}")
    assert found.stdout == "", f"lines that reach for the shared folder beside the project:\n{found.stdout}"


def test_node_frequency_reads_steps_back_from_csv(tmp_path):
    """Empty paths come back from CSV as NaN and one-rank paths as numbers; both must parse."""
    import pandas as pd

    from specnb import Tree
    from specnb.experiments.tables import node_frequency

    tree = Tree.from_paths([(0,), (1,), (0, 0)])
    steps = pd.DataFrame({"accepted_ranks": ["", "0", "0/0", "1"]})
    steps.to_csv(tmp_path / "steps.csv", index=False)
    for frame in (steps, pd.read_csv(tmp_path / "steps.csv"), pd.DataFrame({"accepted_ranks": ["", "0"]})):
        freq = node_frequency(frame, tree)
        assert set(freq) == set(tree.paths)
    freq = node_frequency(pd.read_csv(tmp_path / "steps.csv"), tree)
    assert freq == {(0,): 0.5, (1,): 0.25, (0, 0): 0.25}
