"""Prompt sets: Spec-Bench's prompts (shipped with specnb), specnb's own built-in prompts, and a
reader for Spec-Bench-style JSONL files.

- "spec_bench" (the default): Spec-Bench (Xia et al. 2024), 480 prompts in 13 categories, shipped
  in the package (`specnb/io/data/spec_bench/`, with its Apache-2.0 LICENSE and a NOTICE naming the
  source repository and commit) and read through `importlib.resources`, so a clone, a `pip install`
  and Colab all have it.
- "builtin": 13 short prompts written for specnb, one per Spec-Bench category: an explicit choice
  (a quick look, a test), never a fallback.
- a path: any JSONL file of Spec-Bench records (question_id, category, turns).

A request that the source cannot fill (a category it lacks, more prompts than the filters leave)
raises `PromptRequestError` with what to change, before anything else runs. `describe_prompts` says what a
set holds (source, count, prompts per category): every notebook prints it and records it in its
params.json.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


BUILTIN: tuple[Prompt, ...] = (
    Prompt(
        "b01",
        "writing",
        "Write a short, friendly note inviting your neighbours to a garden party on Saturday afternoon.",
    ),
    Prompt(
        "b02", "roleplay", "You are a museum guide. Describe the oldest object in your museum to a group of children."
    ),
    Prompt(
        "b03",
        "reasoning",
        "A train leaves at 9:40 and arrives at 13:05. How long is the journey? Explain step by step.",
    ),
    Prompt("b04", "math", "What is the sum of the first twenty odd numbers? Show your working."),
    Prompt(
        "b05", "coding", "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."
    ),
    Prompt(
        "b06",
        "extraction",
        "List every city named in this sentence: 'We flew from Lisbon to Oslo, then took the train to Bergen.'",
    ),
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


SOURCES = ("spec_bench", "builtin")  # named sources; anything else is a JSONL path
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"  # of the shipped question.jsonl
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class PromptRequestError(ValueError):
    """A prompt request its source cannot fill; the message says what to change."""


def spec_bench_task(category: str) -> str:
    """Spec-Bench's task of a category: its six tasks are MT-bench (eight categories), translation,
    summarization, qa, math_reasoning and rag, and its overall figures weight each task by its 80
    prompts."""
    return "mt_bench" if category in MT_BENCH else category


def spec_bench_file() -> Traversable:
    """The shipped Spec-Bench question.jsonl (package data, beside its LICENSE and NOTICE)."""
    return files("specnb.io") / "data" / "spec_bench" / "question.jsonl"


def spec_bench_digest() -> str:
    """sha256 of the shipped question.jsonl (SPEC_BENCH_SHA256 when unchanged)."""
    return hashlib.sha256(spec_bench_file().read_bytes()).hexdigest()


def parse_jsonl(text: str, where: str) -> list[Prompt]:
    """Prompts from the text of a Spec-Bench-style JSONL file: question_id, category, turns (the
    first turn used). `where` names the file in errors."""
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompts.append(Prompt(str(record["question_id"]), str(record["category"]), str(record["turns"][0])))
        except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}:{n}: not a Spec-Bench record (question_id, category, turns): {e}") from e
    return prompts


def read_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from a Spec-Bench-style JSONL file on disk."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist (named sources: {', '.join(SOURCES)})")
    return parse_jsonl(path.read_text(), str(path))


def source_prompts(source: str | Path) -> list[Prompt]:
    """Every prompt of a source, in file order: "spec_bench", "builtin" or a JSONL path."""
    if source == "spec_bench":
        return parse_jsonl(spec_bench_file().read_text(), "specnb/io/data/spec_bench/question.jsonl")
    if source == "builtin":
        return list(BUILTIN)
    if source == "auto":
        raise PromptRequestError(
            "prompts='auto' is gone: Spec-Bench ships with specnb, so there is nothing to fall back from. "
            "Use 'spec_bench' (480 prompts, 13 categories), 'builtin' (13 short ones) or a JSONL path."
        )
    return read_jsonl(source)


def load_prompts(
    source: str | Path = "spec_bench",
    per_category: int | None = None,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[Prompt]:
    """Prompts from "spec_bench", "builtin" or a JSONL path.

    per_category keeps the first k prompts of each category (file order), categories filters, and
    limit caps the total, taking categories in turn so a small limit still spans several. Refused
    (PromptRequestError, saying what to change): a category the source does not have, or a limit
    that the filters leave too few prompts to fill.
    """
    prompts = source_prompts(source)
    have = list(dict.fromkeys(p.category for p in prompts))
    if categories is not None:
        missing = [c for c in categories if c not in have]
        if missing:
            raise PromptRequestError(
                f"prompts {source!r} have no categor{'y' if len(missing) == 1 else 'ies'} {missing}; they have {have}"
            )
        wanted = set(categories)
        prompts = [p for p in prompts if p.category in wanted]
    by_category: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    if per_category is not None:
        by_category = {c: ps[:per_category] for c, ps in by_category.items()}
    ordered = interleave(list(by_category.values()))  # categories in turn, so a limit spans them
    if limit is not None and limit > len(ordered):
        counts = ", ".join(f"{c} {len(ps)}" for c, ps in by_category.items())
        raise PromptRequestError(
            f"max_prompts={limit}, but prompts {source!r} with categories={list(categories) if categories else None} "
            f"and per_category={per_category} give only {len(ordered)} ({counts}): lower max_prompts to "
            f"{len(ordered)}, or raise per_category, or widen categories, or choose a larger source"
        )
    return ordered[:limit] if limit is not None else ordered


def interleave(groups: Sequence[Sequence]) -> list:
    """The items of each group in turn: every group's first, then every group's second, ..."""
    return [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]


@dataclass(frozen=True)
class PromptSummary:
    """What a prompt set holds: its source, size and prompts per category (first-seen order)."""

    source: str  # "spec_bench", "builtin", or the JSONL path as given
    count: int
    per_category: tuple[tuple[str, int], ...]
    prompt_format: str = ""  # how the target encodes them (`io.models.prompt_format`); "" not said

    def line(self, label: str = "prompts") -> str:
        names = {"spec_bench": "Spec-Bench (shipped with specnb)", "builtin": "specnb's built-in prompts"}
        counts = ", ".join(f"{c} {n}" for c, n in self.per_category)
        encoded = f"; encoded as {self.prompt_format}" if self.prompt_format else ""
        return f"{label}: {names.get(self.source, self.source)}, {self.count} prompts ({counts}){encoded}"

    def record(self) -> dict:
        """The JSON form params.json keeps."""
        return {
            "source": self.source,
            "count": self.count,
            "per_category": dict(self.per_category),
            **({"prompt_format": self.prompt_format} if self.prompt_format else {}),
        }


def describe_prompts(prompts: Sequence, source: str | Path, prompt_format: str = "") -> PromptSummary:
    """The summary of a prompt set: `Prompt`s, or (id, category, ...) tuples."""
    categories = [p.category if isinstance(p, Prompt) else str(p[1]) for p in prompts]
    return PromptSummary(str(source), len(categories), tuple(Counter(categories).items()), prompt_format)
