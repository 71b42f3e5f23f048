"""The target's own greedy continuation of many prompts, decoded in batches, once per target and
prompt: every pair with that target, and every notebook of a run that asks for the same prompts, reads
the same one (notebooks 01 and 02 under the runner keep it in `session.shared_folder`).

Under greedy decoding the output of exact speculative decoding is the target's greedy continuation,
whatever the drafter and the tree (`analysis.replay`): it belongs to the target alone, and a pair's
collection adds only what its draft says along it (ranks and super-trees, `experiments.collect`; a draft
of another tokenizer re-drafts along it, `analysis.redraft`).

Batched: `core.batch.autoregressive_generate_batch` decodes up to `batch` prompts at once (prompts of
similar length together, since the ragged prefill pads every row to the longest), one forward per token
for all rows. A row's tokens equal its prompt's batch-1 greedy output up to float rounding of kernels
over another batch shape. So every token's top-1 minus top-2 logit is kept (`margins`), and a token whose
margin is below the dtype's tie margin (`analysis.quality.tie_margin`) is a possible tie: decoded alone
the prompt may take the other token from there on. `tie_table` reports them; nothing is hidden (a test
holds batched output equal to batch-1 output, or different only from a reported tie).

Storage: one file per prompt in a `ResultFolder`, named by the prompt id and a content hash of what
decides it (the target's description, max_new_tokens, the stop tokens, the prompt's ids), written
whole: an interrupted decoding resumes with the prompts not yet written, and one folder holds several
targets' continuations side by side.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis.quality import tie_margin
from ..core.batch import autoregressive_generate_batch
from ..core.runtime import eos_ids
from ..io.storage import ResultFolder

SUFFIX = ".npz"
META = "meta"  # the entry of a file's .npz that holds its JSON record


@dataclass(frozen=True)
class Continuation:
    """One prompt's greedy continuation by the target alone."""

    prompt_id: str
    tokens: np.ndarray  # int64 [L]
    stopped: bool  # it ended at a stop token (else at max_new_tokens)
    margins: np.ndarray  # float32 [L]: the target's top-1 minus top-2 logit where it chose tokens[j]
    seconds: float  # its share of its batch's wall clock (the batch's seconds / rows)
    batch: int  # rows decoded together with it (itself included)

    def ties(self, threshold: float) -> int:
        """Tokens chosen by a margin below `threshold`: where decoding alone may differ."""
        return int((self.margins < threshold).sum())


def continue_prompts(
    folder: str | Path | ResultFolder,
    target: torch.nn.Module,
    describe: Mapping[str, Any],
    prompts: Mapping[str, Sequence[int] | torch.Tensor],
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
    batch: int = 16,
    progress: bool = True,
) -> dict[str, Continuation]:
    """The continuation of every prompt (prompt id -> its ids), decoded where `folder` lacks it, in
    batches of at most `batch` prompts of similar length. describe: what makes the target's output
    (its name, quantization, dtype, linear path: `target_description`); part of each file's name, so
    another target's continuations are never read for this one. eos_token_id: None: the target's
    generation config; () never stops early. Returns them in the order of `prompts`."""
    store = folder if isinstance(folder, ResultFolder) else ResultFolder(str(folder))
    stops = sorted(eos_ids(target, eos_token_id))
    ids = {str(p): _ids(x) for p, x in prompts.items()}
    names = {p: file_name(p, x, describe, max_new_tokens, stops) for p, x in ids.items()}
    todo = sorted((p for p in ids if not store.exists(names[p])), key=lambda p: len(ids[p]))
    bar = tqdm(total=len(ids), initial=len(ids) - len(todo), desc="continuations", unit="prompt", disable=not progress)
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        result = autoregressive_generate_batch(
            target,
            [torch.tensor(ids[p]) for p in chunk],  # host ids: the loop moves them
            max_new_tokens,
            eos_token_id=stops,
            margins=True,
        )
        for p, row in zip(chunk, result.rows):
            tokens = row.tokens.numpy().astype(np.int64)
            meta = {
                "prompt_id": p,
                "stopped": bool(len(tokens)) and int(tokens[-1]) in stops,
                "seconds": result.total_time / len(chunk),
                "batch": len(chunk),
                "describe": dict(describe),
            }
            margins = np.asarray(row.meta["margins"], dtype=np.float32)
            store.write_arrays(names[p], {"tokens": tokens, "margins": margins, META: np.array(json.dumps(meta))})
        bar.update(len(chunk))
    bar.close()
    return {p: _read(store, names[p]) for p in ids}


def target_description(label: str, model: torch.nn.Module, linear: str) -> dict[str, str]:
    """What decides a target's greedy output here: its label (name and quantization), its dtype and
    its linear layers' path (`kernels.cpu_linear`); the device type too, whose kernels round apart."""
    return {
        "target": label,
        "dtype": str(model.dtype).removeprefix("torch."),
        "linear": linear,
        "device": model.device.type,
    }


def file_name(
    prompt_id: str, prompt: Sequence[int], describe: Mapping[str, Any], max_new_tokens: int, stops: Sequence[int]
) -> str:
    """A continuation's file name: a readable prefix of the prompt id, then a content hash of what
    decides it."""
    content = {
        "describe": dict(describe),
        "max_new_tokens": int(max_new_tokens),
        "stops": [int(s) for s in stops],
        "prompt": [int(i) for i in prompt],
    }
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prompt_id)[:40].lstrip(".")
    return f"{safe}-{digest}{SUFFIX}"


def tie_table(continuations: Mapping[str, Continuation], dtype: torch.dtype, gap: float = 0.0) -> pd.DataFrame:
    """One row per prompt: tokens, the batch it was decoded in, the smallest margin, and the tokens
    chosen by a margin below `analysis.quality.tie_margin(dtype, gap)` (where decoding it alone may
    differ), with the threshold used."""
    threshold = tie_margin(dtype, gap)
    rows = [
        {
            "prompt_id": p,
            "tokens": len(c.tokens),
            "stopped": c.stopped,
            "batch": c.batch,
            "smallest_margin": float(c.margins.min()) if len(c.margins) else float("nan"),
            "possible_ties": c.ties(threshold),
            "tie_margin": threshold,
        }
        for p, c in continuations.items()
    ]
    return pd.DataFrame(rows)


def _ids(prompt: Sequence[int] | torch.Tensor) -> list[int]:
    return prompt.reshape(-1).tolist() if isinstance(prompt, torch.Tensor) else [int(i) for i in prompt]


def _read(store: ResultFolder, name: str) -> Continuation:
    arrays = store.read_arrays(name)
    meta = json.loads(str(arrays[META]))
    return Continuation(
        prompt_id=meta["prompt_id"],
        tokens=arrays["tokens"].astype(np.int64),
        stopped=bool(meta["stopped"]),
        margins=arrays["margins"].astype(np.float32),
        seconds=float(meta["seconds"]),
        batch=int(meta["batch"]),
    )
