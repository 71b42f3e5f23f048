"""Adaptive draft length: how many tokens to draft this step, learned from the steps before.

Two rules, both from Hugging Face transformers' assisted generation, so that a user can compare a
fixed draft length with the adaptive ones that library ships:

    AdaptiveLength(drafter, start=20, schedule="heuristic")
        the draft-length schedule of `AssistedCandidateGenerator.update_candidate_strategy`
        (transformers/generation/candidate_generator.py): +2 after a step whose drafted tokens were
        all accepted, -1 (never below 1) after any other step. Wraps any drafter.
    ModelDrafter(model, confidence_threshold=t)   (in `drafting`)
        transformers' `ConfidenceCriteria` (stopping_criteria.py): stop the chain after the first
        drafted token x whose draft probability q(x) is below t. It lives in `ModelDrafter` because
        only a model drafter has q while it drafts.

Why stopping early keeps sampling lossless. The rejection rule (`acceptance`) checks the token
drafted at each position against p at that position; for a chain this is Leviathan et al.'s rule
and the emitted token there is a sample of p whatever q was, given the tokens before it. Whether a
next position is drafted at all is decided here from draft-side values only: the confidence rule
looks at q(x_d), a function of the tokens x_1..x_d (and of the draft's own randomness, not the
verifier's); the length schedule looks at earlier steps. If x_d is rejected, the decision is moot;
if it is accepted, x_1..x_d are now committed output and the decision is a function of them, so
the next token is a sample of p given them, drafted (x_{d+1} ~ q, checked) or not (the bonus
token, drawn from p). Every emitted token is therefore distributed as p given the tokens before
it. The drafted tokens are still draws from q, so q is returned and the ordinary rule applies.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import DynamicCache

from ..core.acceptance import Acceptance
from ..core.drafting import Draft, Drafter, as_drafter
from ..core.sampling import SamplingConfig
from ..core.trees import Tree

SCHEDULES = ("heuristic", "heuristic_transient", "constant")


class AdaptiveLength(Drafter):
    """Drafts `tree.truncated(min(length, tree.depth))` with `drafter` and adapts `length`.

    Matches transformers (5.x) exactly: the count starts at `start` (transformers'
    `num_assistant_tokens`, default 20); after each step it grows by 2 when the number of accepted
    tokens equals the number drafted (for a chain; for a tree, the depth drafted) and otherwise
    shrinks by 1, to at least 1 (`update_candidate_strategy`). The count itself is not capped; the
    requested tree's depth caps what is drafted (transformers caps by the tokens left in the same
    way). Across generate calls (`reset`), schedule "heuristic" keeps the count (transformers writes
    it back to the assistant's generation config), "heuristic_transient" returns it to `start`, and
    "constant" never changes it. One difference: transformers counts the accepted tokens after
    cutting them at EOS; `observe` sees the acceptance before that cut, so the step that ends a
    generation at EOS may update differently (it is the last step of its call).

    For a tree request the rule adapts its depth. `lengths` records the count used at each draft.
    """

    def __init__(self, drafter: Drafter | torch.nn.Module, start: int = 20, schedule: str = "heuristic") -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
        if start < 1:
            raise ValueError(f"start must be >= 1, got {start}")
        self.drafter = as_drafter(drafter)
        self.start = start
        self.schedule = schedule
        self.length = start
        self.lengths: list[int] = []

    def reset(self) -> None:
        self.drafter.reset()
        if self.schedule == "heuristic_transient":
            self.length = self.start
        self.lengths = []

    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        request = tree.truncated(self.length)
        self.lengths.append(self.length)
        draft = self.drafter.draft(tokens, request, sampling, generator)
        return draft if draft.tree is not None else replace(draft, tree=request)

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        if self.schedule != "constant":
            drafted = draft.tree.depth if draft.tree is not None else 0
            if acceptance.num_accepted == drafted:
                self.length += 2
            else:
                self.length = max(1, self.length - 1)
        self.drafter.observe(draft, acceptance)

    @property
    def shares_target_cache(self) -> bool:
        return self.drafter.shares_target_cache

    @property
    def evictions(self) -> int:
        return self.drafter.evictions

    def kv_bytes(self) -> int:
        return self.drafter.kv_bytes()

    def release(self) -> None:
        self.drafter.release()

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        self.drafter.check_request(tree, sampling)

    def bind_target_cache(self, cache: DynamicCache) -> None:
        self.drafter.bind_target_cache(cache)
