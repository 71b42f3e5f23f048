"""A collection on disk: what was collected per prompt, with the parameters that made it.

Stored with `io.storage`: a folder with collection.json (the `CollectConfig` and a description of
what made it), prompts.jsonl (one `Sweep` line per finished prompt, with its timings) and one .npz
per prompt (`PromptData.arrays`, written atomically before its line). An interrupted collection
resumes where it stopped, and a folder made with other parameters is refused (`open_folder`).
`analysis.collect` fills it; `analysis.replay` reads it.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path as FilePath
from typing import Any, Iterable, Mapping

import numpy as np

from ..core.sampling import SamplingConfig
from ..core.trees import Tree
from ..drafters.methods import parse_method
from ..io.storage import Sweep, read_arrays, write_arrays, write_json

PARAMS_FILE = "collection.json"
UNITS_FILE = "prompts.jsonl"
UNIT_KEY = ("prompt_id",)


@dataclass(frozen=True)
class CollectConfig:
    """What a collection measures; stored beside it and checked when it resumes."""

    max_new_tokens: int = 64  # target tokens per prompt (fewer if EOS ends the continuation)
    top_k: int = 16  # greedy: ranks >= top_k are stored as "out"; replayed trees use ranks < top_k
    run_tree: str = "chain:4"  # shape:budget of the exact speculative run that makes the continuation
    eos_token_id: tuple[int, ...] | None = None  # None: the target's generation config; () = never stop
    super_k: int = 0  # super-tree children per node; 0 = no super-trees (they cost draft forwards)
    super_depth: int = 6  # D, super-tree depth
    super_size: int = 64  # M, nodes kept per position (global top-M by cumulative draft log-prob)
    super_chunk: int = 8  # positions whose off-path nodes share one draft forward per depth
    temperature: float = 0.0  # > 0: sampling mode (continuation sampled, alphas collected)
    sample_top_k: int = 0  # sampling transforms shared by p and q (`SamplingConfig`)
    sample_top_p: float = 1.0
    samples: int = 0  # R draft samples of the cover tree per position (sampling mode)
    cover_tree: str = "kary2:6"  # sampling: drawn R times per position; any gap-free subtree replays
    sample_chunk: int = 16  # samples verified in one target pass
    seed: int = 0
    cross_tokenizer: bool = False  # the draft has another tokenizer: the continuation comes from a
    #                                cross-tokenizer run (run_tree drafted in draft tokens) and nothing
    #                                else is collected; trees are re-drafted (`analysis.redraft`)

    def __post_init__(self) -> None:
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", tuple(int(e) for e in self.eos_token_id))
        if self.sampling and self.samples < 1:
            raise ValueError("sampling mode (temperature > 0) needs samples >= 1 draft samples per position")
        if self.super_k and self.sampling:
            raise ValueError("super-trees are collected in greedy mode only")
        self.run  # an unknown or non-model method fails here
        if self.cross_tokenizer and (self.sampling or self.super_k):
            raise ValueError("a cross-tokenizer collection is greedy and holds the continuation only (no super-trees)")
        if self.sampling and self.cover.has_rank_gaps:
            raise ValueError(f"cover tree {self.cover_tree} has rank gaps; sampling needs ranks 0..k-1")

    @property
    def sampling(self) -> bool:
        return self.temperature > 0.0

    @property
    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.sample_top_k, self.sample_top_p)

    @property
    def run(self) -> Tree:
        """The tree of the run that makes the continuation (`run_tree`, a draft-model method)."""
        return _model_tree(self.run_tree)

    @property
    def cover(self) -> Tree:
        """The tree drawn per position in sampling mode (`cover_tree`)."""
        return _model_tree(self.cover_tree)


@dataclass(frozen=True)
class PromptData:
    """One prompt's collected arrays (L = continuation length)."""

    prompt_id: str
    category: str
    prompt: np.ndarray  # int64 [P] prompt ids
    tokens: np.ndarray  # int64 [L] the target's continuation
    stopped: bool  # the continuation ended at EOS (else at max_new_tokens)
    times: dict[str, float]  # seconds per collection stage
    run_steps: np.ndarray | None = None  # int32 [S, 4]: the continuation run's steps (position, drafted,
    #                                      accepted, tokens added), a real run to check the replay against
    ranks: np.ndarray | None = None  # int16 [L]: rank of tokens[j] under the draft; >= top_k: out
    logq: np.ndarray | None = None  # float32 [L]: draft log-probability of tokens[j]
    rank_margin: np.ndarray | None = None  # float32 [L]: smallest gap between tokens[j]'s draft logit and
    #                                       any other of the top_k + 1: below a tie margin its rank may flip
    # super-trees, nodes sorted by (cumulative log q desc, depth, path); -1 / padding past `size`
    super_size: np.ndarray | None = None  # int16 [L]: nodes kept at each position (<= M)
    super_parent: np.ndarray | None = None  # int16 [L, M]: parent's index in the sorted order, -1 root
    super_rank: np.ndarray | None = None  # int16 [L, M]: sibling rank (the draft's r-th child)
    super_depth: np.ndarray | None = None  # int16 [L, M]
    super_token: np.ndarray | None = None  # int64 [L, M]
    super_score: np.ndarray | None = None  # float32 [L, M]: cumulative draft log-probability
    super_on_path: np.ndarray | None = None  # int16 [L, D]: sorted index of the on-path node at depth d, M if absent
    alpha: np.ndarray | None = None  # float32 [L, R, N + 1, K]: sampling, per cover row and child rank

    def arrays(self) -> dict[str, np.ndarray]:
        """The collected arrays by field name (what is stored in the prompt's .npz)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in values.items() if isinstance(v, np.ndarray)}


@dataclass(frozen=True)
class Collection:
    """Collected prompts with the parameters that made them; `Collection.load(folder)`."""

    config: CollectConfig
    describe: dict[str, Any]
    prompts: tuple[PromptData, ...]
    folder: FilePath | None = field(default=None, compare=False)

    @classmethod
    def load(cls, folder: str | FilePath, prompt_ids: Iterable[str] | None = None) -> Collection:
        folder = FilePath(folder)
        params = json.loads((folder / PARAMS_FILE).read_text())
        config = _config_from_json(params["config"])
        units = Sweep(folder / UNITS_FILE, UNIT_KEY)
        table = units.meta_frame()
        stored = [] if table.empty else table["prompt_id"].astype(str).tolist()
        wanted = stored if prompt_ids is None else [str(p) for p in prompt_ids]
        missing = [p for p in wanted if p not in stored]
        if missing:
            raise KeyError(f"prompts not collected in {folder}: {missing}")
        prompts = []
        for pid in wanted:
            meta = units.meta({"prompt_id": pid})
            arrays = read_arrays(folder / meta["file"])
            prompts.append(PromptData(
                prompt_id=pid, category=str(meta["category"]), stopped=bool(meta["stopped"]),
                times={k[:-2]: float(v) for k, v in meta.items() if k.endswith("_s")}, **arrays,
            ))
        return cls(config, params.get("describe", {}), tuple(prompts), folder)

    @property
    def sampling(self) -> bool:
        return self.config.sampling

    @property
    def has_super_trees(self) -> bool:
        return bool(self.prompts) and self.prompts[0].super_size is not None

    def times(self) -> dict[str, float]:
        """Seconds per collection stage, summed over prompts."""
        out: dict[str, float] = {}
        for p in self.prompts:
            for k, v in p.times.items():
                out[k] = out.get(k, 0.0) + v
        return out


def _model_tree(spec: str) -> Tree:
    method = parse_method(spec)
    if method.drafter != "draft":
        raise ValueError(f"{spec!r}: a collection's trees are the draft model's static shapes (e.g. chain:4, kary2:6)")
    return method.tree


def open_folder(folder: FilePath, config: CollectConfig, describe: Mapping[str, Any] | None) -> Sweep:
    """The unit store of a collection folder, made with `config` (written on first use); a folder
    made with other parameters or another description is refused."""
    params = {"config": _config_to_json(config), "describe": dict(describe or {})}
    existing = folder / PARAMS_FILE
    if existing.exists():
        stored = json.loads(existing.read_text())
        if stored != json.loads(json.dumps(params)):
            raise ValueError(
                f"{folder} holds a collection made with other parameters:\n  stored: {stored}\n  asked:  {params}"
            )
    else:
        write_json(existing, params)
    return Sweep(folder / UNITS_FILE, UNIT_KEY)


def save_prompt(folder: FilePath, units: Sweep, data: PromptData) -> None:
    """Store one prompt's arrays, then its unit line: a unit line always means a whole file."""
    name = file_name(data.prompt_id)
    write_arrays(folder / name, data.arrays())
    units.add(
        {"prompt_id": data.prompt_id}, [],
        meta={"category": data.category, "file": name, "prompt_length": int(len(data.prompt)),
              "length": int(len(data.tokens)), "stopped": data.stopped,
              **{f"{k}_s": v for k, v in data.times.items()}},
    )


def file_name(prompt_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prompt_id)[:40]
    return f"{safe}-{zlib.crc32(prompt_id.encode()):08x}.npz"


def _config_to_json(config: CollectConfig) -> dict:
    out = asdict(config)
    if not out["cross_tokenizer"]:  # the field is newer than some stored collections: written only when set
        del out["cross_tokenizer"]
    out["eos_token_id"] = None if config.eos_token_id is None else list(config.eos_token_id)
    return out


def _config_from_json(d: Mapping[str, Any]) -> CollectConfig:
    d = dict(d)
    if d.get("eos_token_id") is not None:
        d["eos_token_id"] = tuple(d["eos_token_id"])
    return CollectConfig(**d)
