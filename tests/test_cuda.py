"""What only a GPU shows; every test here is skipped without CUDA (this project's machines have
none: these run where one is present, e.g. `./run_tests.sh -m gpu` on a Colab T4).

- float16 exactness up to numerical ties: speculative output against the target's own greedy
  output, every divergence a tie (`analysis.quality`), for several trees;
- 4-bit verification (bitsandbytes nf4 kernels for one row and for many): the same;
- timing synchronisation: the clock waits for queued kernels;
- peak memory: reported on CUDA, at least the KV cache the run held;
- sampling-mode collection on CUDA (tensors built on the host never mix with device ones);
- FlexAttention's kernel options below compute capability 8.0.
"""

import pytest
import torch
from conftest import random_prompt, tiny_model

from specnb import Tree, autoregressive_generate, speculative_generate
from specnb.analysis.collection import CollectConfig
from specnb.analysis.quality import compare_greedy, score
from specnb.core.runtime import Clock
from specnb.experiments.collect import collect

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (no GPU here)")]
TREES = [Tree.chain(4), Tree.kary(2, 10), Tree.sparse(16)]


def on_gpu(model, dtype=torch.float16):
    return model.to(device="cuda", dtype=dtype).eval()


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.describe())
def test_float16_speculative_equals_greedy_up_to_ties(tree):
    target, draft = on_gpu(tiny_model(0, scale=30.0)), on_gpu(tiny_model(1, scale=30.0, layers=1))
    for seed in (1, 2, 3):
        ids = random_prompt(seed).cuda()
        reference = autoregressive_generate(target, ids, max_new_tokens=24, eos_token_id=()).tokens
        spec = speculative_generate(target, draft, ids, tree=tree, max_new_tokens=24, eos_token_id=()).tokens
        verdict = compare_greedy(spec, reference, score(target, ids, spec).margins, torch.float16)
        assert verdict.equal, verdict


def test_4bit_verify_equals_greedy_up_to_ties(tmp_path):
    """bitsandbytes takes one kernel for a single row (decode) and another for many (verify)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tiny_model(0, scale=30.0, hidden=64).save_pretrained(tmp_path / "tiny")
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16)
    target = AutoModelForCausalLM.from_pretrained(
        tmp_path / "tiny", dtype=torch.float16, device_map={"": "cuda"}, quantization_config=nf4
    ).eval()
    draft = on_gpu(tiny_model(1, scale=30.0, layers=1, hidden=64))
    ids = random_prompt(4).cuda()
    reference = autoregressive_generate(target, ids, max_new_tokens=24, eos_token_id=()).tokens
    for tree in TREES:
        spec = speculative_generate(target, draft, ids, tree=tree, max_new_tokens=24, eos_token_id=()).tokens
        verdict = compare_greedy(spec, reference, score(target, ids, spec).margins, torch.float16)
        assert verdict.equal, (tree.describe(), verdict)


def test_the_clock_waits_for_queued_kernels():
    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    clock = Clock("cuda")
    start = clock.now()
    for _ in range(20):
        x = x @ x / 4096
    waited = clock.now() - start
    # the same work, timed without waiting, returns before the kernels finish
    torch.cuda.synchronize()
    import time

    t0 = time.perf_counter()
    for _ in range(20):
        x = x @ x / 4096
    queued = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert waited > queued


def test_peak_memory_is_reported_on_cuda():
    target, draft = on_gpu(tiny_model(0, scale=30.0)), on_gpu(tiny_model(1, scale=30.0, layers=1))
    result = speculative_generate(target, draft, random_prompt(5).cuda(), tree=Tree.kary(2, 10), max_new_tokens=16)
    kv = 2 * target.config.num_hidden_layers * target.config.num_key_value_heads * 12 * 2 * (7 + 16)  # head 12, fp16
    assert result.peak_memory_bytes is not None and result.peak_memory_bytes >= kv


def test_sampled_collection_runs_on_cuda(tmp_path):
    target, draft = (
        on_gpu(tiny_model(0, scale=4.0), torch.float32),
        on_gpu(tiny_model(1, scale=4.0, layers=1), torch.float32),
    )
    config = CollectConfig(
        max_new_tokens=6, eos_token_id=(), temperature=1.0, samples=4, cover_tree="kary2:6", sample_chunk=2
    )
    c = collect(tmp_path / "c", target, draft, {"p": random_prompt(6).cuda()}, config)
    alpha = c.prompts[0].alpha
    assert alpha.shape[:2] == (6, 4) and ((alpha >= 0) & (alpha <= 1)).all()


def test_flex_kernel_options_below_ampere():
    from specnb.bench.attention import flex_kernel_options

    options = flex_kernel_options("cuda", torch.float16, 128)
    if torch.cuda.get_device_capability() < (8, 0):
        assert options["BLOCK_M"] * options["BLOCK_N"] <= 32 * 32 and options["num_stages"] == 1
    else:
        assert options == {}
    assert flex_kernel_options("cpu", torch.float32, 128) == {}
