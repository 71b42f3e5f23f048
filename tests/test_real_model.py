"""Greedy speculative output equals plain greedy output on a real model: SmolLM2-135M-Instruct
(embedded GGUF, installed by the test command's set-up), with drafts that agree with everything
(the model itself), with part of it (its first layers), and with almost nothing (a random model
with the same vocabulary)."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specnb import Tree, autoregressive_generate, speculative_generate, summarize
from specnb.io.models import prompt_ids, truncate_layers
from specnb.io.prompts import BUILTIN

pytestmark = pytest.mark.slow

MAX_NEW = 40


@pytest.fixture(scope="module")
def smollm(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def drafts(smollm):
    model, _ = smollm
    early = truncate_layers(copy.deepcopy(model), 8)  # the first 8 of 30 layers + final norm + head
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=model.config.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    random = LlamaForCausalLM(cfg).eval()
    return {"self": model, "first_8_layers": early, "random": random}


@pytest.fixture(scope="module")
def references(smollm):
    model, tokenizer = smollm
    out = {}
    for prompt in BUILTIN[:2]:
        ids = prompt_ids(tokenizer, prompt.text)
        out[prompt.id] = (ids, autoregressive_generate(model, ids, max_new_tokens=MAX_NEW))
    return out


CASES = [
    ("self", "chain", 4),
    ("self", "sparse", 12),
    ("first_8_layers", "chain", 5),
    ("first_8_layers", "kary2", 8),
    ("first_8_layers", "wide", 4),
    ("first_8_layers", "sparse", 16),
    ("random", "chain", 3),
    ("random", "kary2", 6),
]


@pytest.mark.parametrize("draft_name, shape, budget", CASES)
def test_greedy_equals_plain_greedy_smollm2(smollm, drafts, references, draft_name, shape, budget):
    model, tokenizer = smollm
    tree = Tree.preset(shape, budget)
    results = []
    for pid, (ids, reference) in references.items():
        result = speculative_generate(model, drafts[draft_name], ids, tree=tree, max_new_tokens=MAX_NEW)
        assert result.tokens.tolist() == reference.tokens.tolist(), (
            f"{pid}: speculative output differs from plain greedy\n"
            f"  spec : {tokenizer.decode(result.tokens)!r}\n  plain: {tokenizer.decode(reference.tokens)!r}"
        )
        results.append(result)
    s = summarize(results)
    if draft_name == "self":
        assert s.acceptance_length > 0.9 * min(tree.depth, MAX_NEW - 1)
    if draft_name == "random":
        assert s.acceptance_rate < 0.05
    if draft_name == "first_8_layers":
        assert 0.0 < s.acceptance_rate < 1.0
