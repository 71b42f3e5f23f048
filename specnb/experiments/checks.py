"""What a notebook refuses before any model loads: parameters that cannot give what the notebook
promises (an empty training split, a budget timed that is not replayed), each refused with a
`ParameterError` whose message names the parameters to change and to what.

    medusa_split          05: the training and test splits hold the prompts asked for
    speed_budget          05: the budget timed is one of the budgets replayed

Prompt requests a source cannot fill at all (a category it lacks, a max_prompts the filters leave
too few prompts for) are refused earlier, by `io.prompts.load_prompts` (`PromptRequestError`).
"""

from __future__ import annotations

from collections.abc import Sequence


class ParameterError(ValueError):
    """Notebook parameters that cannot give what the notebook promises; nothing was loaded."""


def medusa_split(
    train: Sequence, test: Sequence, train_prompts: int, test_prompts: int, training: bool, loaded: bool, pool: str
) -> None:
    """Refuse splits that cannot hold what 05 asks for: the prompts `pool` describes (how many, from
    where, how long at most) were split into `train` and `test` (before the counts were cut);
    `training`: some heads train on the training split; `loaded`: some heads come from elsewhere,
    and their trees are designed on half the test prompts."""
    problems = []
    if test_prompts < 1 or len(test) < test_prompts:
        problems.append(f"test_prompts={test_prompts} but the test split holds {len(test)}")
    if training and (train_prompts < 1 or len(train) < train_prompts):
        problems.append(f"train_prompts={train_prompts} (heads='train') but the training split holds {len(train)}")
    if loaded and test_prompts < 2:
        problems.append(
            f"test_prompts={test_prompts}, but loaded heads' trees are designed on half the test prompts "
            "and measured on the other half: at least 2"
        )
    if not problems:
        return
    raise ParameterError(
        "; ".join(problems) + f": {pool}, split into {len(train)} training and {len(test)} test prompts "
        "(each category's 1st, 5th, 9th, ... prompt held out for testing). "
        "Lower train_prompts or test_prompts, raise max_prompt_tokens, or use a larger prompt source "
        "(prompts='spec_bench': 480 prompts)"
    )


def speed_budget(budget: int, budgets: Sequence[int]) -> None:
    """05 times each drafter's best tree at `budget`, chosen among the replayed `budgets`."""
    if budget not in budgets:
        raise ParameterError(
            f"speed_budget={budget} is not one of budgets={list(budgets)}: the tree timed at it is the "
            "best one replayed at that budget. Set speed_budget to one of them"
        )
