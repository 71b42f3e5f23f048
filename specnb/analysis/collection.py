"""A collection on disk: what was collected per prompt, with the parameters that made it.

A folder (`io.storage.ResultFolder`: a local path, a shared file system, or an fsspec URL) holding
collection.json (the `CollectConfig` and a description of what made it, e.g. the pair) and one .npz
per *unit*: one prompt collected for the pair under the config (`Unit`). A unit's file is named by
the prompt id and a content hash of (description, config, prompt id, prompt ids) (`unit_name`), and
it is the unit's whole record: the arrays (`PromptData.arrays`) and a `meta` entry (category, stop,
timings), written atomically. So a unit is done exactly when its file exists: an interrupted
collection resumes where it stopped, any number of workers (`experiments.executors`) and restarts leave
one file per unit, and the folder needs no index that several writers would have to share. A
folder made with other parameters is refused (`open_folder`). `experiments.collect` fills it;
`analysis.replay` reads it (`Collection.load`). Folders in the legacy layout (a prompts.jsonl
index beside the .npz files) load but are not written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path as FilePath
from typing import Any

import numpy as np

from ..core.sampling import SamplingConfig
from ..core.trees import Tree
from ..drafters.methods import parse_method
from ..io.storage import ResultFolder, Sweep, read_arrays

PARAMS_FILE = "collection.json"
UNIT_SUFFIX = ".npz"
META = "meta"  # the entry of a unit's .npz that holds its JSON record (a 0-d string array)
LEGACY_UNITS_FILE = "prompts.jsonl"  # the legacy layout's index (one `Sweep` line per prompt): read only


@dataclass(frozen=True)
class CollectConfig:
    """What a collection measures; stored beside it and checked when it resumes."""

    max_new_tokens: int = 64  # target tokens per prompt (fewer if EOS ends the continuation)
    top_k: int = 16  # greedy: ranks >= top_k are stored as "out"; replayed trees use ranks < top_k
    run_tree: str = "chain:4"  # shape:budget of the exact speculative run that makes the continuation
    #                            (continuation "run")
    continuation: str = "run"  # "run": from an exact speculative run of run_tree, its steps kept (a real
    #                            run to check the replay against); "target": the target's own greedy
    #                            decoding, given with each unit (`experiments.continuations`: decoded in
    #                            batches, once per target, shared by every pair with that target)
    eos_token_id: tuple[int, ...] | None = None  # None: the target's generation config; () = never stop
    super_k: int = 0  # super-tree children per node; 0 = no super-trees (they cost draft forwards)
    super_depth: int = 6  # D, super-tree depth
    super_size: int = 64  # M, nodes kept per position (global top-M by cumulative draft log-prob)
    super_chunk: int = 64  # positions grown together: their off-path nodes, one each, share a draft forward per round
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
        _ = self.run  # an unknown or non-model method fails here
        if self.continuation not in ("run", "target"):
            raise ValueError(f"continuation is 'run' or 'target', got {self.continuation!r}")
        if self.continuation == "target" and self.sampling:
            raise ValueError("a sampled continuation depends on the tree: sampling collections make their own (run)")
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
    # Medusa heads (`training.medusa.collect_heads`): rank of tokens[t + d] under head d + 1
    # at the step that starts with t tokens generated (>= top_k: out); replaces the shifted `ranks`
    head_ranks: np.ndarray | None = None  # int16 [L, K]

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
    folder: FilePath | str | None = field(default=None, compare=False)  # a path, or the URL it was loaded from

    @classmethod
    def load(cls, folder: str | FilePath | ResultFolder, prompt_ids: Iterable[str] | None = None) -> Collection:
        """The collected prompts in `folder`: those of `prompt_ids` in that order, or every unit
        sorted by prompt id. Raises KeyError for a prompt not collected, ValueError for a prompt
        collected twice with different prompt ids (ask for the exact units with `load_units`)."""
        store = as_folder(folder)
        config, describe = _read_params(store)
        if store.exists(LEGACY_UNITS_FILE):
            return _load_legacy(store, config, describe, prompt_ids)
        by_id: dict[str, list[str]] = {}
        for name in store.names(UNIT_SUFFIX):
            by_id.setdefault(_read_meta(store, name)["prompt_id"], []).append(name)
        wanted = sorted(by_id) if prompt_ids is None else [str(p) for p in prompt_ids]
        missing = [p for p in wanted if p not in by_id]
        if missing:
            raise KeyError(f"prompts not collected in {store}: {missing}")
        twice = {p: by_id[p] for p in wanted if len(by_id[p]) > 1}
        if twice:
            raise ValueError(f"{store} holds prompts collected twice, from different prompt ids: {twice}")
        return cls(config, describe, tuple(read_unit(store, by_id[p][0]) for p in wanted), _location(store))

    @classmethod
    def load_units(cls, folder: str | FilePath | ResultFolder, names: Sequence[str]) -> Collection:
        """The units named `names` (file names, `Unit.name`), in that order."""
        store = as_folder(folder)
        config, describe = _read_params(store)
        return cls(config, describe, tuple(read_unit(store, n) for n in names), _location(store))

    @property
    def sampling(self) -> bool:
        return self.config.sampling

    @property
    def has_super_trees(self) -> bool:
        """Some prompts have super-trees (`super_tree_prompts` are those)."""
        return any(p.super_size is not None for p in self.prompts)

    def super_tree_prompts(self) -> Collection:
        """The collection of the prompts collected with super-trees (a subset when the collection
        was made with `super_prompts`): what dynamic trees are replayed on."""
        return replace(self, prompts=tuple(p for p in self.prompts if p.super_size is not None))

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


@dataclass(frozen=True)
class Unit:
    """One unit of collection work: one prompt, for the folder's pair and config. It is what a
    worker is sent (names and ids, never models), and it becomes one file, `name`."""

    name: str  # the file name: the prompt id and a content hash (`unit_name`)
    prompt_id: str
    category: str
    prompt: tuple[int, ...]  # the prompt's input ids
    super_trees: bool = True  # collect its super-trees (when the config has super_k > 0)
    continuation: tuple[int, ...] | None = None  # the target's continuation (config.continuation "target")
    stopped: bool = False  # it ended at a stop token
    seconds: float = 0.0  # what decoding it cost (its share of its batch)


def units_of(
    prompts: Mapping[str, Any],
    config: CollectConfig,
    describe: Mapping[str, Any] | None = None,
    categories: Mapping[str, str] | None = None,
    continuations: Mapping[str, Any] | None = None,
) -> list[Unit]:
    """The units of a collection: prompts maps prompt id -> input ids ([1, P] tensor or a sequence).
    A description naming "super_prompts" (`collect.collect_units`) limits super-trees to those.
    continuations: prompt id -> the target's `experiments.continuations.Continuation` (config.continuation
    "target": every prompt needs one)."""
    subset = (describe or {}).get("super_prompts")
    if config.continuation == "target":
        missing = [p for p in prompts if str(p) not in (continuations or {})]
        if missing:
            raise ValueError(
                f"a collection of the target's continuations needs one for every prompt: none for {missing}"
            )
    out = []
    for pid, ids in prompts.items():
        flat = tuple(int(i) for i in (ids.reshape(-1).tolist() if hasattr(ids, "reshape") else ids))
        given = (continuations or {}).get(str(pid)) if config.continuation == "target" else None
        tokens = None if given is None else tuple(int(t) for t in given.tokens)
        out.append(
            Unit(
                unit_name(str(pid), flat, config, describe, tokens),
                str(pid),
                (categories or {}).get(pid, ""),
                flat,
                super_trees=subset is None or str(pid) in subset,
                continuation=tokens,
                stopped=bool(given.stopped) if given is not None else False,
                seconds=float(given.seconds) if given is not None else 0.0,
            )
        )
    return out


def unit_name(
    prompt_id: str,
    prompt: Sequence[int],
    config: CollectConfig,
    describe: Mapping[str, Any] | None = None,
    continuation: Sequence[int] | None = None,
) -> str:
    """A unit's file name: a readable prefix of the prompt id, then a content hash of what decides
    its data: the description (the pair), the config, the prompt id and its ids (and the given
    continuation, where the target's own is given)."""
    content = {
        "describe": collection_params(config, describe)["describe"],
        "config": _config_to_json(config),
        "prompt_id": prompt_id,
        "prompt": [int(i) for i in prompt],
    }
    if continuation is not None:
        content["continuation"] = [int(t) for t in continuation]
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prompt_id)[:40].lstrip(".")
    return f"{safe}-{digest}{UNIT_SUFFIX}"


def as_folder(folder: str | FilePath | ResultFolder) -> ResultFolder:
    return folder if isinstance(folder, ResultFolder) else ResultFolder(str(folder))


def open_folder(
    folder: str | FilePath | ResultFolder, config: CollectConfig, describe: Mapping[str, Any] | None
) -> ResultFolder:
    """The collection folder made with `config` and `describe` (recorded by the first writer); a
    folder made with other parameters or another description, or in the legacy layout, is refused."""
    store = as_folder(folder)
    params = collection_params(config, describe)
    if store.exists(LEGACY_UNITS_FILE):
        raise ValueError(
            f"{store} holds a collection in the earlier layout (prompts.jsonl): it still loads "
            "and replays, but collect into a new folder"
        )
    stored = store.create_json(PARAMS_FILE, params)
    if stored != params:
        raise ValueError(
            f"{store} holds a collection made with other parameters:\n  stored: {stored}\n  asked:  {params}"
        )
    return store


def save_unit(folder: ResultFolder, name: str, data: PromptData) -> None:
    """Store one unit: its arrays and its record in one file, atomically (the file is the record)."""
    meta = {
        "prompt_id": data.prompt_id,
        "category": data.category,
        "stopped": data.stopped,
        "prompt_length": int(len(data.prompt)),
        "length": int(len(data.tokens)),
        "times": data.times,
    }
    folder.write_arrays(name, {**data.arrays(), META: np.array(json.dumps(meta))})


def read_unit(folder: ResultFolder, name: str) -> PromptData:
    arrays = folder.read_arrays(name)
    meta = json.loads(str(arrays.pop(META)))
    return PromptData(
        prompt_id=meta["prompt_id"],
        category=meta["category"],
        stopped=bool(meta["stopped"]),
        times={k: float(v) for k, v in meta["times"].items()},
        **arrays,
    )


def _read_meta(folder: ResultFolder, name: str) -> dict:
    return json.loads(str(folder.read_arrays(name, [META])[META]))


def _read_params(folder: ResultFolder) -> tuple[CollectConfig, dict[str, Any]]:
    params = folder.read_json(PARAMS_FILE)
    if params is None:
        raise FileNotFoundError(f"no collection in {folder} (no {PARAMS_FILE})")
    return _config_from_json(params["config"]), params.get("describe", {})


def collection_params(config: CollectConfig, describe: Mapping[str, Any] | None) -> dict:
    """collection.json's content, as JSON reads it back: what decides a collection."""
    return json.loads(json.dumps({"config": _config_to_json(config), "describe": dict(describe or {})}, default=str))


def _location(folder: ResultFolder) -> FilePath | str:
    return folder.location if folder.is_url else FilePath(folder.location)


def _load_legacy(
    folder: ResultFolder, config: CollectConfig, describe: dict, prompt_ids: Iterable[str] | None
) -> Collection:
    """A folder in the legacy layout: prompts.jsonl (one `Sweep` line per prompt) beside the .npz."""
    if folder.is_url:
        raise ValueError(f"{folder}: collections of the earlier layout load from a local folder only")
    units = Sweep(FilePath(folder.location) / LEGACY_UNITS_FILE, ("prompt_id",))
    table = units.meta_frame()
    stored = [] if table.empty else table["prompt_id"].astype(str).tolist()
    wanted = stored if prompt_ids is None else [str(p) for p in prompt_ids]
    missing = [p for p in wanted if p not in stored]
    if missing:
        raise KeyError(f"prompts not collected in {folder}: {missing}")
    prompts = []
    for pid in wanted:
        meta = units.meta({"prompt_id": pid})
        arrays = read_arrays(FilePath(folder.location) / meta["file"])
        prompts.append(
            PromptData(
                prompt_id=pid,
                category=str(meta["category"]),
                stopped=bool(meta["stopped"]),
                times={k[:-2]: float(v) for k, v in meta.items() if k.endswith("_s")},
                **arrays,
            )
        )
    return Collection(config, describe, tuple(prompts), FilePath(folder.location))


def _config_to_json(config: CollectConfig) -> dict:
    out = asdict(config)
    if not out["cross_tokenizer"]:  # written only when set: the keys of collections without it are unchanged
        del out["cross_tokenizer"]
    if out["continuation"] == "run":  # likewise
        del out["continuation"]
    out["eos_token_id"] = None if config.eos_token_id is None else list(config.eos_token_id)
    return out


def _config_from_json(d: Mapping[str, Any]) -> CollectConfig:
    d = dict(d)
    if d.get("eos_token_id") is not None:
        d["eos_token_id"] = tuple(d["eos_token_id"])
    return CollectConfig(**d)
