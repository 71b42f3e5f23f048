"""Baselines from transformers itself, measured with specnb's instrumentation: the same
`GenerationResult` and `Step` records as `speculative_generate`, so they sit in the same tables.

What it holds:
    hf_generate                 `target.generate` greedy or sampled, no assistant (one Step per token)
    hf_assisted_generate        transformers assisted generation (Leviathan et al. 2023 / the HF
                                "assisted generation" blog) with a draft model at a FIXED draft length
    hf_uag_generate             the same with a draft of another tokenizer: transformers' universal
                                assisted generation (greedy: text re-encoded in windows; sampling:
                                universal speculative decoding over the shared tokens)
    hf_prompt_lookup_generate   transformers prompt lookup decoding (`prompt_lookup_num_tokens`,
                                Saxena 2023): drafts copied from n-gram matches in the sequence

transformers returns no acceptance statistics (its `generate` returns tokens only). They are recovered here
without changing its decoding: for the length of one `generate` call, the target's
`_get_candidate_generator` is wrapped (on the instance, restored afterwards) so that the candidate
generator it builds is handed to `_assisted_decoding` inside a recording proxy. The proxy times
`get_candidates` (draft time) and the span up to `update_candidate_strategy(input_ids, scores,
num_matches)` (verify time: the target forward, acceptance and cache crop), and keeps each step's
candidate tokens (`generate` takes no candidate generator; an instance attribute, unlike a
class patch, reaches no other model). After the call the steps are rebuilt from the final sequence:

    num_tokens   = tokens the step appended (input_ids grows by exactly this much)
    num_drafted  = candidate tokens the target verified that step
    num_accepted = the candidate tokens that are a prefix of what was appended: the same
                   convention as specnb (an EOS accepted from the draft counts as accepted; it is
                   not the bonus token). transformers' own `num_matches` (kept in
                   `meta["hf_num_matches"]`) is `appended - 1` in transformers 5.x (it is recounted
                   after the EOS and length cuts), which differs only where an EOS or the length
                   limit cut the step short.

Fixed draft length for `hf_assisted_generate`: transformers reads the draft length from the
*assistant's* `generation_config`; for the call it is set to `num_assistant_tokens = k`, schedule
"constant" and `assistant_confidence_threshold = 0` (no early stop on low confidence), then
restored. The draft is still capped so as not to pass `max_new_tokens` (as specnb truncates its
tree), and it stops at a stop token, as transformers does (the assistant shares the target's stop
tokens; with `eos_token_id=()` there are none). Every step's real length is recorded.

Universal assisted generation (`hf_uag_generate`) passes `tokenizer` and `assistant_tokenizer`,
with the same fixed draft length k, counted in DRAFT tokens (transformers' `num_assistant_tokens`).
Its candidates, and so `num_drafted` and `num_accepted`, are target tokens (the re-encoded draft);
`Step.draft_tokens` is the number of draft tokens the assistant generated that step, read from the
candidate generator transformers built for the call (the assistant sequence after drafting minus the
one before). A step can verify no candidate (the re-encoding added no target token): a plain step.
transformers refuses it when the two configs' vocabulary sizes are equal.

Stop tokens: `eos_token_id` has specnb's meaning: default the target's generation config, `()` =
never stop. `()` is passed to transformers as `eos_token_id=None`, which builds no stopping
criterion and no EOS logits processor, so greedy outputs stay comparable token for token (a
`min_new_tokens` would instead mask EOS out of the logits and change them).

Timing is wall clock (CUDA synchronized). `prefill_time` is the set-up before the first step:
transformers has no separate prefill, the prompt goes through the target in the first step's
verify forward (and through the draft in its first draft), so the first step is the slow one.
Prompt lookup's per-step time is all "verify" except the n-gram search, recorded as draft time.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from ..core.batch import BatchResult, check_prompts
from ..core.generation import GenerationResult, Step
from ..core.runtime import Clock, check_input, cut_at_eos, eos_ids, peak_memory, reset_peak_memory
from ..core.sampling import GREEDY, SamplingConfig

# generation-config fields that add logits processors specnb does not apply; a target whose
# generation config sets any of them is refused rather than compared unfairly
_UNSUPPORTED_PROCESSORS = (
    "sequence_bias",
    "bad_words_ids",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "exponential_decay_length_penalty",
    "min_p",
    "top_h",
)


def hf_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """`target.generate` without an assistant: transformers' own decoding loop, one Step per token
    (times from a streamer, so the first step includes the prompt)."""
    ids = check_input(input_ids, max_new_tokens).to(target.device)
    kwargs = _generate_kwargs(target, max_new_tokens, sampling, eos_token_id)
    streamer = _TokenClock(target.device)
    reset_peak_memory(target.device)
    with _seeded(sampling.seed, target.device):
        start = streamer.now()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer, **kwargs)
        total = streamer.now() - start
    new = out[0, ids.shape[1] :].cpu()
    times = streamer.times[1:]  # put() is first called with the prompt, before any forward
    steps = tuple(
        Step(i, 0, 0, 1, 0.0, times[i] - (times[i - 1] if i else streamer.times[0]), child_counts=(0,))
        for i in range(len(new))
    )
    return GenerationResult(
        tokens=new.long(),
        steps=steps,
        prompt_length=int(ids.shape[1]),
        prefill_time=streamer.times[0] - start,
        total_time=total,
        peak_memory_bytes=peak_memory(target.device),
        method="hf_generate",
    )


def hf_generate_batch(
    target: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    pad_token_id: int,
    max_new_tokens: int = 64,
    eos_token_id: int | Sequence[int] | None = None,
) -> BatchResult:
    """transformers' own batching: `generate` on the prompts left-padded with `pad_token_id` under an
    attention mask, greedy. Each row: its new tokens, cut after its first stop token (transformers
    pads finished rows), no per-step records; the batch's wall clock."""
    sequences = check_prompts(prompts, max_new_tokens)
    ids, mask = _left_padded(sequences, pad_token_id)
    width = ids.shape[1]
    kwargs = _generate_kwargs(target, max_new_tokens, GREEDY, eos_token_id)
    eos = eos_ids(target, eos_token_id)
    clock = Clock(target.device)
    start = clock.now()
    out = target.generate(
        ids.to(target.device), attention_mask=mask.to(target.device), pad_token_id=pad_token_id, **kwargs
    )
    total = clock.now() - start
    rows = []
    for b, seq in enumerate(sequences):
        new, _ = cut_at_eos(out[b, width:].tolist(), eos)
        rows.append(
            GenerationResult(
                torch.tensor(new, dtype=torch.long),
                (),
                len(seq),
                0.0,
                total,
                None,  # host: results
                "hf_generate_batch",
                {"batch_size": len(sequences)},
            )
        )
    return BatchResult(tuple(rows), total, 0.0)


def hf_assisted_refusal(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    pad_token_id: int,
    num_assistant_tokens: int = 4,
) -> str | None:
    """What transformers says when asked for assisted generation on more than one row at once
    (docs/batch-size.md names its issues): the error message, or None if it ran."""
    ids, mask = _left_padded(check_prompts(prompts, 1), pad_token_id)
    kwargs = _generate_kwargs(target, 2, GREEDY, None)
    try:
        with _generation_config_set(draft, _constant_chain(num_assistant_tokens)), _without(INTERNAL_WARNINGS):
            target.generate(
                ids.to(target.device),
                attention_mask=mask.to(target.device),
                assistant_model=draft,
                pad_token_id=pad_token_id,
                **kwargs,
            )
    except ValueError as e:
        return str(e).splitlines()[0]
    return None


def hf_assisted_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    input_ids: torch.Tensor,
    num_assistant_tokens: int = 4,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """transformers assisted generation with `draft` proposing a chain of `num_assistant_tokens`
    tokens per step (schedule "constant", confidence threshold 0).

    input_ids: long [1, T]. Greedy (temperature 0) output equals the target's greedy output; with
    temperature > 0 transformers applies speculative sampling with the draft's logits.
    """
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    ids = check_input(input_ids, max_new_tokens).to(target.device)
    kwargs = _generate_kwargs(target, max_new_tokens, sampling, eos_token_id)
    # the assistant's own generate fills an unset eos from its model's config: give it the target's
    # stop tokens (none for eos_token_id=())
    fixed = _constant_chain(num_assistant_tokens, eos_token_id=kwargs["eos_token_id"])
    with _generation_config_set(draft, fixed):
        return _recorded_generate(
            target,
            ids,
            {**kwargs, "assistant_model": draft},
            "hf_assisted",
            sampling.seed,
            {"num_assistant_tokens": num_assistant_tokens},
        )


def hf_uag_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    input_ids: torch.Tensor,
    tokenizers: tuple[Any, Any],
    num_assistant_tokens: int = 4,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """transformers' universal assisted generation: `draft`, whose tokenizer differs from the
    target's, drafts `num_assistant_tokens` of its own tokens per step (schedule "constant",
    confidence threshold 0); the text is re-encoded in the target's tokens and verified.

    input_ids: long [1, T], target tokens; tokenizers: (the target's, the draft's). Greedy output equals
    the target's greedy output."""
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    if target.config.get_text_config().vocab_size == draft.config.get_text_config().vocab_size:
        raise ValueError(
            "transformers' universal assisted generation refuses two models whose configs have the same "
            "vocabulary size; use hf_assisted (a shared vocabulary) or specnb's xtok drafter"
        )
    ids = check_input(input_ids, max_new_tokens).to(target.device)
    kwargs = _generate_kwargs(target, max_new_tokens, sampling, eos_token_id)
    fixed = _constant_chain(num_assistant_tokens, eos_token_id=kwargs["eos_token_id"])
    kwargs.update(assistant_model=draft, tokenizer=tokenizers[0], assistant_tokenizer=tokenizers[1])
    with _generation_config_set(draft, fixed):
        return _recorded_generate(
            target, ids, kwargs, "hf_uag", sampling.seed, {"num_assistant_tokens": num_assistant_tokens}
        )


def hf_prompt_lookup_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    prompt_lookup_num_tokens: int = 10,
    max_matching_ngram_size: int = 2,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """transformers prompt lookup decoding: each step drafts up to `prompt_lookup_num_tokens`
    tokens that followed the earliest earlier occurrence of the sequence's last n-gram (n =
    max_matching_ngram_size down to 1; cut before a stop token), or nothing when there is no match
    (a plain target step).

    Not exactly recoverable: transformers does not cap a prompt-lookup draft at the tokens left, so
    the last step may verify candidates beyond `max_new_tokens`; they count as drafted, and the
    ones past the limit can never count as accepted (acceptance rate is biased low by at most one
    step's worth).
    """
    ids = check_input(input_ids, max_new_tokens).to(target.device)
    kwargs = _generate_kwargs(target, max_new_tokens, sampling, eos_token_id)
    kwargs.update(prompt_lookup_num_tokens=prompt_lookup_num_tokens, max_matching_ngram_size=max_matching_ngram_size)
    meta = {"prompt_lookup_num_tokens": prompt_lookup_num_tokens, "max_matching_ngram_size": max_matching_ngram_size}
    return _recorded_generate(target, ids, kwargs, "hf_prompt_lookup", sampling.seed, meta)


# ---- recording ------------------------------------------------------------------------------


@dataclass
class _StepRecord:
    """What the proxy sees of one step; filled in two calls, read after `generate` returns."""

    before: int  # sequence length when the step began
    candidates: torch.Tensor  # long [n], the proposed tokens (read after the call: no sync per step)
    drafted_at: float  # get_candidates called
    verified_at: float  # get_candidates returned; the target's verify forward starts
    done_at: float = 0.0  # update_candidate_strategy called: accepted tokens appended, cache cropped
    after: int = 0  # sequence length after the step
    num_matches: int = 0  # what transformers passed to update_candidate_strategy
    draft_tokens: int | None = None  # tokens the assistant drafted in its own vocabulary (universal
    #                                  assisted generation); None: the candidates themselves


class _RecordingCandidates:
    """Proxy of a transformers CandidateGenerator: delegates everything, records each step."""

    def __init__(self, inner: Any, clock: Clock) -> None:
        self._inner = inner
        self._clock = clock
        self.steps: list[_StepRecord] = []
        self._assistant_before: int | None = None
        prepare = getattr(inner, "_prepare_assistant_input_ids", None)
        if prepare is not None:  # a different-tokenizer generator: count the assistant's own tokens

            def counted(*args: Any, **kwargs: Any) -> Any:
                out = prepare(*args, **kwargs)
                self._assistant_before = int(out[0].shape[1])
                return out

            inner._prepare_assistant_input_ids = counted  # on this call's generator only

    def __getattr__(self, name: str) -> Any:  # requires_model_outputs, model_kwargs_overrides, ...
        return getattr(self._inner, name)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs: Any) -> tuple[torch.LongTensor, Any]:
        t0 = self._clock.now()
        candidate_ids, logits = self._inner.get_candidates(input_ids, **kwargs)
        t1 = self._clock.now()
        start = input_ids.shape[1]
        self.steps.append(_StepRecord(start, candidate_ids[0, start:], t0, t1, draft_tokens=self._assistant_tokens()))
        return candidate_ids, logits

    def _assistant_tokens(self) -> int | None:
        """Tokens the assistant generated in this `get_candidates` (different tokenizers only)."""
        if self._assistant_before is None:
            return None
        after = getattr(self._inner, "prev_assistant_ids", None)
        if after is None:
            after = getattr(self._inner, "_prev_assistant_ids", None)
        before, self._assistant_before = self._assistant_before, None
        return None if after is None else int(after.shape[1]) - before

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        step = self.steps[-1]
        step.done_at = self._clock.now()
        step.after = input_ids.shape[1]
        step.num_matches = int(num_matches)
        self._inner.update_candidate_strategy(input_ids, scores, num_matches)


@contextmanager
def _recording(target: torch.nn.Module, clock: Clock) -> Iterator[list[_RecordingCandidates]]:
    """For one `generate` call: the candidate generator transformers builds is wrapped in a
    `_RecordingCandidates`, yielded in the list. The instance attribute is removed afterwards."""
    made: list[_RecordingCandidates] = []
    had_own = "_get_candidate_generator" in vars(target)
    original = target._get_candidate_generator

    def build(*args: Any, **kwargs: Any) -> _RecordingCandidates:
        made.append(_RecordingCandidates(original(*args, **kwargs), clock))
        return made[-1]

    target._get_candidate_generator = build
    try:
        yield made
    finally:
        if had_own:
            target._get_candidate_generator = original
        else:
            del target._get_candidate_generator


def _recorded_generate(
    target: torch.nn.Module, ids: torch.Tensor, kwargs: dict, method: str, seed: int | None, meta: dict
) -> GenerationResult:
    clock = Clock(target.device)
    reset_peak_memory(target.device)
    with _seeded(seed, target.device), _recording(target, clock) as made, _without(INTERNAL_WARNINGS):
        start = clock.now()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        total = clock.now() - start
    if len(made) != 1:
        raise RuntimeError(f"expected transformers to build one candidate generator, it built {len(made)}")
    sequence = out[0].tolist()
    prompt_length = int(ids.shape[1])
    steps = tuple(_step(sequence, prompt_length, record) for record in made[0].steps)
    if sum(s.num_tokens for s in steps) != len(sequence) - prompt_length:
        raise RuntimeError("recorded steps do not add up to the generated tokens")  # a transformers change
    first_draft = made[0].steps[0].drafted_at if steps else start
    meta = {**meta, "hf_num_matches": tuple(record.num_matches for record in made[0].steps)}
    return GenerationResult(
        tokens=torch.tensor(sequence[prompt_length:], dtype=torch.long),  # host: results live on the CPU
        steps=steps,
        prompt_length=prompt_length,
        prefill_time=first_draft - start,
        total_time=total,
        peak_memory_bytes=peak_memory(target.device),
        method=method,
        meta=meta,
    )


def _step(sequence: list[int], prompt_length: int, record: _StepRecord) -> Step:
    drafted = record.candidates.tolist()
    added = sequence[record.before : record.after]
    accepted = 0
    while accepted < min(len(drafted), len(added)) and drafted[accepted] == added[accepted]:
        accepted += 1
    # a chain: one child at the root and at each accepted node that is not the chain's end
    child_counts = tuple(int(d < len(drafted)) for d in range(accepted + 1))
    return Step(
        position=record.before - prompt_length,
        num_drafted=len(drafted),
        num_accepted=accepted,
        num_tokens=len(added),
        draft_time=record.verified_at - record.drafted_at,
        verify_time=record.done_at - record.verified_at,
        tree_depth=len(drafted),
        accepted_ranks=(0,) * accepted,
        child_counts=child_counts,
        draft_tokens=record.draft_tokens,
    )


# ---- configuration --------------------------------------------------------------------------


def _generate_kwargs(
    target: torch.nn.Module, max_new_tokens: int, sampling: SamplingConfig, eos_token_id: int | Sequence[int] | None
) -> dict[str, Any]:
    """`generate` keyword arguments with specnb's semantics: batch 1, no beams, no logits processors
    but the sampling transforms specnb applies, the same stop tokens.

    Keyword arguments, not a GenerationConfig: transformers fills a config's None fields from the
    model's generation config, so `eos_token_id=None` there would still stop at the model's EOS;
    a keyword None is kept.
    """
    if sampling.typical is not None:
        raise ValueError("transformers' decoders have no typical acceptance: pass a SamplingConfig without `typical`")
    base = getattr(target, "generation_config", None) or GenerationConfig()
    for name in _UNSUPPORTED_PROCESSORS:
        if getattr(base, name, None) is not None:
            raise ValueError(
                f"the target's generation config sets {name}={getattr(base, name)!r}, a logits processor "
                "specnb does not apply; clear it so outputs are comparable"
            )
    kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens,
        min_new_tokens=None,
        min_length=0,
        num_beams=1,
        do_sample=not sampling.greedy,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        use_cache=True,
        return_dict_in_generate=False,
        eos_token_id=sorted(eos_ids(target, eos_token_id)) or None,  # () = no stop token: None for transformers
    )
    if not sampling.greedy:  # greedy ignores the warpers (and transformers warns when they are set)
        kwargs.update(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
        )
    return kwargs


def _constant_chain(num_assistant_tokens: int, **more: Any) -> dict[str, Any]:
    """The draft's generation-config fields for a chain of `num_assistant_tokens` every step
    (schedule "constant", confidence threshold 0: no early stop), and `more`."""
    return {
        "num_assistant_tokens": num_assistant_tokens,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
        **more,
    }


def _left_padded(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), long [B, W] on the host: each sequence right-aligned after `pad_token_id`s."""
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)  # host: moved by the caller
    mask = torch.zeros(len(sequences), width, dtype=torch.long)  # host
    for b, seq in enumerate(sequences):
        ids[b, width - len(seq) :] = torch.tensor(seq)  # host
        mask[b, width - len(seq) :] = 1
    return ids, mask


@contextmanager
def _generation_config_set(model: torch.nn.Module, values: dict) -> Iterator[None]:
    """Set fields of `model.generation_config` for the block, then put the original back."""
    original = model.generation_config
    patched = copy.deepcopy(original)
    for name, value in values.items():
        setattr(patched, name, value)
    model.generation_config = patched
    try:
        yield
    finally:
        model.generation_config = original


# ---- helpers --------------------------------------------------------------------------------


# What transformers' assisted generation logs about its own internal calls on every run (candidate_generator.py:
# the assistant's `generate` given a config and min/max_new_tokens; BPE decoding with
# clean_up_tokenization_spaces=True): nothing a user can act on, dropped for the baseline calls only.
INTERNAL_WARNINGS = (
    ("transformers.generation.utils", "Passing `generation_config` together with generation-related"),
    ("transformers.tokenization_utils_tokenizers", "Ignoring clean_up_tokenization_spaces=True for BPE"),
)


@contextmanager
def _without(logged: Sequence[tuple[str, str]]) -> Iterator[None]:
    """Drop the records of `logged` = (logger, message start) pairs for the block."""
    filters = []
    for name, start in logged:

        def keep(record: logging.LogRecord, start: str = start) -> bool:
            return not record.getMessage().startswith(start)

        logging.getLogger(name).addFilter(keep)
        filters.append((name, keep))
    try:
        yield
    finally:
        for name, keep in filters:
            logging.getLogger(name).removeFilter(keep)


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """transformers samples with torch's global generator: seed it for the call, and give the
    caller's generator state back afterwards."""
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        yield


class _TokenClock(Clock):
    """A transformers streamer that only notes when each token arrives."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(self.now())

    def end(self) -> None:
        pass
