"""One batch-1 verdict per pair and machine: notebooks 01, 03 and 06 price notebook 01's recommended
tree with the same function (`analysis.heldout.choose`) on the same inputs (01's held-out tau and
interval, 01's verify curve from its run folder), so they print the same speed-up and verdict; a
notebook's own curve or tau is shown beside it, with how it differs, and never as a verdict."""

from __future__ import annotations

import pandas as pd
import pytest
from test_heldout import PRESETS, collection, curve

from specnb.analysis import heldout
from specnb.experiments import earlier as from_01
from specnb.experiments import replay_study
from specnb.io import tree_results

PAIR = "d -> t"


def fake_01_run(outputs, spread: float = 0.1, draft: float = 0.05):
    """A finished run folder of notebook 01: tree_results.json and the verify curve it priced with."""
    c = collection(odd=2, same=4)
    held = heldout.score(c, PRESETS, [2, 4], k=3, seed=5)
    curve_01 = curve(spread=spread, draft=draft)
    _, choice = heldout.choose(held.table, held.trees, curve_01, "t", "d")  # what 01's cell does
    folder = outputs / "01_tree_shapes" / "run"
    tree_results.write(folder, replay_study.tree_results(PAIR, c, held, choice, device="cpu"))
    curve_01.to_csv(folder / from_01.CURVE_FILE, index=False)
    return choice, folder


@pytest.mark.parametrize(("spread", "draft"), [(0.1, 0.05), (0.3, 0.6)])
def test_01_03_and_06_print_the_same_batch_1_prediction_and_verdict(tmp_path, spread, draft):
    choice, folder = fake_01_run(tmp_path, spread, draft)
    # 03 and 06 both read 01 through acceptance_from ("latest" or the folder named)
    for source in ("latest", str(folder)):
        earlier = tree_results.acceptance_from(source, PAIR, tmp_path, [0.5, 0.1])
        assert earlier.folder == folder
        verdict = from_01.pair_verdict(earlier)
        assert (verdict["shape"], int(verdict["budget"])) == (choice.shape, choice.budget)
        assert verdict["expected_tau"] == pytest.approx(choice.tau, rel=1e-12)
        assert verdict["speedup"] == pytest.approx(choice.speedup, rel=1e-12)
        assert verdict["speedup_ci_low"] == pytest.approx(choice.speedup_low, rel=1e-12)
        assert verdict["speedup_ci_high"] == pytest.approx(choice.speedup_high, rel=1e-12)
        assert verdict["verdict"] == choice.verdict
        text = from_01.verdict_reading(earlier, verdict)
        # the numbers as 01's deploy header prints them
        assert f"{choice.speedup:.2f}x [{choice.speedup_low:.2f}, {choice.speedup_high:.2f}]" in text
        assert f"**{choice.verdict}**" in text
        assert (
            f"{choice.speedup:.2f}x [{choice.speedup_low:.2f}, {choice.speedup_high:.2f}]"
            in (folder / tree_results.DEPLOY_FILE).read_text()
        )


def test_a_notebooks_own_inputs_are_shown_beside_the_verdict_not_as_one(tmp_path):
    choice, folder = fake_01_run(tmp_path, spread=0.3, draft=0.6)
    earlier = tree_results.acceptance_from("latest", PAIR, tmp_path, [0.5])
    verdict = from_01.pair_verdict(earlier)
    assert verdict["verdict"] == "cannot tell"
    # 03 on the same (shared) curve: the same inputs
    same = from_01.pair_verdict(earlier, pd.read_csv(folder / from_01.CURVE_FILE), "t", "d")
    assert "the same inputs as 01's" in from_01.verdict_reading(earlier, verdict, same, "03's curve")
    # 03 on a curve of its own: another price, the verdict unchanged
    faster = from_01.pair_verdict(earlier, curve(verify=1.0, slope=0.0), "t", "d")
    text = from_01.verdict_reading(earlier, verdict, faster, "03's curve")
    assert faster["speedup"] != pytest.approx(verdict["speedup"]) and "not a verdict" in text
    assert text.count("**cannot tell**") == 1 and "pays off" not in text
    # 06: its own batch-1 row of the same tree (`batch_rows`), another tau and other costs
    rows = pd.DataFrame(
        [
            {"batch": b, "shape": f"01:{choice.shape}", "budget": choice.budget, "tau": 3.0, "t_draft_s": 0.1}
            | {"t_verify_s": 1.0, "baseline_tokens_per_s": b / 1.0, "speedup": 1.4 + b}
            for b in (1, 2)
        ]
    )
    own = from_01.batch_row(rows, verdict)
    assert own["batch"] == 1 and from_01.batch_row(rows, verdict, batch=4) is None
    text = from_01.verdict_reading(earlier, verdict, own, "06's batched curves")
    assert "2.40x, not a verdict" in text and "tau 3.00 vs" in text and "**cannot tell**" in text


def test_without_a_run_of_01_there_is_no_verdict(tmp_path):
    earlier = tree_results.acceptance_from("latest", PAIR, tmp_path, [0.5, 0.1])
    assert earlier.folder is None and from_01.pair_verdict(earlier) is None
    assert from_01.pair_verdict(earlier, curve(), "t", "d") is None
    assert "verdict: none here" in from_01.verdict_reading(earlier, None)
