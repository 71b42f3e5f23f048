"""Prompt sets: specnb's own built-in prompts, and readers for Spec-Bench-style JSONL files.

The built-in prompts are written for specnb (one or two per Spec-Bench category, so per-category
tables have something to show without any data file). Spec-Bench (Xia et al. 2024;
`question.jsonl`, 480 prompts in 13 categories) is read in place from a path the user gives; in
this project's checkout it lies at `../shared/data/spec_bench/question.jsonl`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


BUILTIN: tuple[Prompt, ...] = (
    Prompt("b01", "writing", "Write a short, friendly note inviting your neighbours to a garden party on Saturday afternoon."),
    Prompt("b02", "roleplay", "You are a museum guide. Describe the oldest object in your museum to a group of children."),
    Prompt("b03", "reasoning", "A train leaves at 9:40 and arrives at 13:05. How long is the journey? Explain step by step."),
    Prompt("b04", "math", "What is the sum of the first twenty odd numbers? Show your working."),
    Prompt("b05", "coding", "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."),
    Prompt("b06", "extraction", "List every city named in this sentence: 'We flew from Lisbon to Oslo, then took the train to Bergen.'"),
    Prompt("b07", "stem", "Explain in three sentences why the sky looks blue during the day."),
    Prompt("b08", "humanities", "Summarise the main causes of the French Revolution in a short paragraph."),
    Prompt("b09", "translation", "Translate into French: 'The library opens at nine and closes at six on weekdays.'"),
    Prompt(
        "b10",
        "summarization",
        "Summarise this text in one sentence: 'The city council met on Tuesday to discuss the new bus "
        "routes. After a long debate, members agreed to add two night lines and to extend the number 4 "
        "route to the hospital. The changes start in March and will be reviewed after six months.'",
    ),
    Prompt(
        "b11",
        "qa",
        "Using only this passage, answer: when was the bridge finished? Passage: 'Work on the stone "
        "bridge began in 1821. Floods delayed it twice, and it was finally finished in 1829.'",
    ),
    Prompt("b12", "math_reasoning", "Tom has 3 boxes of 12 pencils and gives away 15 pencils. How many are left?"),
    Prompt("b13", "rag", "Given the note 'Meeting moved to room 4B at 3 pm', where and when is the meeting?"),
)


MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def spec_bench_task(category: str) -> str:
    """Spec-Bench's task of a category: its six tasks are MT-bench (eight categories), translation,
    summarization, qa, math_reasoning and rag, and its overall figures weight each task by its 80
    prompts."""
    return "mt_bench" if category in MT_BENCH else category


def default_spec_bench_path() -> Path | None:
    """Spec-Bench's question.jsonl: $SPECNB_SPEC_BENCH, else ../shared/data/spec_bench/ beside the
    project; None when neither exists (a user's clone has no ../shared)."""
    env = os.environ.get("SPECNB_SPEC_BENCH")
    if env:
        return Path(env)
    candidate = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
    return candidate if candidate.exists() else None


def read_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from a Spec-Bench-style JSONL file: question_id, category, turns (first turn used)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    prompts = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                prompts.append(Prompt(str(record["question_id"]), str(record["category"]), str(record["turns"][0])))
            except (KeyError, IndexError, json.JSONDecodeError) as e:
                raise ValueError(f"{path}:{n}: not a Spec-Bench record (question_id, category, turns): {e}") from e
    return prompts


def load_prompts(
    source: str | Path = "builtin",
    per_category: int | None = None,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[Prompt]:
    """Prompts from "builtin", "spec_bench" (the default Spec-Bench path), "auto" (Spec-Bench when
    its file is found, else builtin) or a JSONL path.

    per_category keeps the first k prompts of each category (file order), categories filters, and
    limit caps the total, taking categories in turn so a small limit still spans several.
    """
    if source == "auto":
        source = "spec_bench" if default_spec_bench_path() is not None else "builtin"
    if source == "builtin":
        prompts = list(BUILTIN)
    elif source == "spec_bench":
        path = default_spec_bench_path()
        if path is None:
            raise FileNotFoundError(
                "Spec-Bench's question.jsonl was not found: set SPECNB_SPEC_BENCH to its path, "
                "pass the path itself, or use source='builtin'"
            )
        prompts = read_jsonl(path)
    else:
        prompts = read_jsonl(source)
    if categories is not None:
        wanted = set(categories)
        prompts = [p for p in prompts if p.category in wanted]
    by_category: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    if per_category is not None:
        by_category = {c: ps[:per_category] for c, ps in by_category.items()}
    ordered = interleave(list(by_category.values()))  # categories in turn, so a limit spans them
    return ordered[:limit] if limit is not None else ordered


def interleave(groups: Sequence[Sequence]) -> list:
    """The items of each group in turn: every group's first, then every group's second, ..."""
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]
