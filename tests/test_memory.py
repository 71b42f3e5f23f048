"""Memory estimates from configs: the arithmetic by hand on tiny configs (what transformers' 4-bit
quantizer converts, what it leaves in float16, tied weights counted once, the KV cache), and every
notebook of the t4 profile within the T4's budget, as docs/t4.md says."""

from pathlib import Path

import pytest
from transformers import LlamaConfig

from specnb.analysis.memory import kv_cache_bytes, nf4_linear_bytes, weight_bytes
from specnb.io.model_configs import config_of
from specnb.notebook.estimate import PART_NAMES, T4_USABLE, gb, memory_markdown, profile_memory
from specnb.notebook.profiles import notebooks, resolve


def tiny(tied: bool) -> LlamaConfig:
    # head size 16: q, o 64 x 64; k, v 64 x 32 (2 kv heads); gate, up 64 x 128; down 128 x 64
    return LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )


# per layer: q 4096 + k 2048 + v 2048 + o 4096 + gate 8192 + up 8192 + down 8192 = 36864 Linear values
LINEAR = 2 * 36864
NORMS = 2 * 2 * 64 + 64  # two RMSNorms a layer, one final
EMBED = 100 * 64


def test_nf4_linear_by_hand():
    assert nf4_linear_bytes(64, 64) == 4096 // 2 + (4096 // 64) * 4 == 2304
    assert nf4_linear_bytes(3, 5, blocksize=4) == 8 + 4 * 4  # 15 values: 7.5 -> 8 bytes, 4 blocks


@pytest.mark.parametrize("tied", [False, True])
def test_float16_weights_by_hand(tied):
    w = weight_bytes(tiny(tied))
    assert w.quantized == 0 and w.quantized_modules == 0
    assert w.total == 2 * (LINEAR + NORMS + EMBED * (1 if tied else 2))  # a tied lm_head counted once


@pytest.mark.parametrize("tied", [False, True])
def test_nf4_weights_by_hand(tied):
    w = weight_bytes(tiny(tied), "4bit")
    assert w.quantized_modules == 2 * 7  # every projection; never lm_head
    assert w.quantized == LINEAR // 2 + (LINEAR // 64) * 4  # 4 bits a value + one float32 absmax per 64
    assert w.unquantized == 2 * (NORMS + EMBED * (1 if tied else 2))  # embeddings, norms, lm_head in float16
    assert "lm_head" in w.not_converted
    if tied:
        assert {"model.embed_tokens", "model.norm"} <= set(w.not_converted)


def test_kv_cache_by_hand():
    # 2 (k, v) x 2 layers x 2 kv heads x 16 head size x 10 tokens x 2 bytes
    assert kv_cache_bytes(tiny(False), 10) == 2 * 2 * 2 * 16 * 10 * 2 == 2560
    explicit = LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=32, num_hidden_layers=3
    )
    assert kv_cache_bytes(explicit, 1) == 2 * 3 * 1 * 32 * 1 * 2


def test_every_t4_notebook_fits_a_t4_and_the_t4_page_says_so():
    """One row per notebook of the profile, each the estimate that gates a run (on CUDA); the table
    is docs/t4.md's, so it cannot drift from the profile or the estimate."""
    rows = profile_memory("t4")
    assert [r.notebook for r in rows] == [nb.stem for nb in notebooks()]
    assert all(r.device == "cuda" and r.dtype == "float16" for r in rows)
    for r in rows:
        assert 0 < r.total <= 14e9 == T4_USABLE, r.describe()
    by = {r.notebook: r for r in rows}
    # Llama-2-7B in nf4: 6.48e9 Linear values at 4.5 bits, embeddings and lm_head (2 x 32000 x 4096) in float16
    llama2 = weight_bytes(config_of("meta-llama/Llama-2-7b-hf"), "4bit").total
    assert 4.0e9 < llama2 < 4.3e9 and by["01_tree_shapes"].weights > llama2
    assert max(rows, key=lambda r: r.total).notebook == "06_batch_size"  # docs/t4.md: the one that comes closest
    pairs = resolve("t4", {}, [], notebooks())["02_model_pairs"]["pairs"]
    assert ("Felladrin/Llama-160M-Chat-v1", "meta-llama/Llama-3.2-3B") in [(p["draft"], p["target"]) for p in pairs]
    table = memory_markdown("t4")
    fits = [x.rsplit("|", 2)[1].strip() for x in table.splitlines() if x.startswith("| 0")]
    assert "fits in 14 GB" in table and fits == ["yes"] * len(rows)
    line = next(x for x in table.splitlines() if x.startswith("| 06_batch_size |"))
    assert f"**{gb(by['06_batch_size'].total)}**" in line and gb(by["06_batch_size"].kv_cache) in line
    assert PART_NAMES["grid"] in table and PART_NAMES["training"] not in table  # only parts some notebook has
    t4_page = (Path(__file__).resolve().parents[1] / "docs" / "t4.md").read_text()
    assert table in t4_page, (
        "docs/t4.md's memory table is profile_memory's output (python -m specnb.notebook.estimate memory t4)"
    )
    smaller = memory_markdown("t4", usable=int(5e9))  # a smaller device: the notebooks that do not fit say so
    assert "| 06_batch_size |" in smaller and "**NO** |" in smaller.split("| 06_batch_size |")[1].splitlines()[0]


def test_the_t4_profile_downloads_what_its_configs_add_up_to_and_the_colab_page_says_so():
    """~40 GB: a free Drive's 15 GB cannot hold it (the README once said ~23; docs/colab.md gives it now).
    Llama-2-7B by hand: 6,738,415,616 parameters in float16 files; the published Medusa heads: 5 x (4096^2 + 4096 +
    32000 x 4096) float16 values; the published EAGLE head: fc, one layer and the embedding in float32."""
    from pathlib import Path

    from specnb.notebook.estimate import FREE_DRIVE, download_markdown, drive_warning, profile_downloads

    rows = {r.name: r for r in profile_downloads("t4")}
    assert rows["meta-llama/Llama-2-7b-hf"].parameters == 6_738_415_616
    assert rows["meta-llama/Llama-2-7b-hf"].bytes == 2 * 6_738_415_616
    assert rows["FasterDecoding/medusa-vicuna-7b-v1.3"].bytes == 5 * (4096 * 4096 + 4096 + 32000 * 4096) * 2
    assert rows["JackFram/llama-160m"].dtype == "float32"
    eagle = 8192 * 4096 + 4096 + 4 * 4096**2 + 3 * 4096 * 11008 + 4096 + 32000 * 4096
    assert (rows["yuhuili/EAGLE-Vicuna-7B-v1.3"].what, rows["yuhuili/EAGLE-Vicuna-7B-v1.3"].bytes) == (
        "EAGLE head",
        4 * eagle,
    )
    total = sum(r.bytes for r in rows.values())
    assert 39e9 < total < 41e9 and total > FREE_DRIVE
    table = download_markdown("t4")
    assert f"**{total / 1e9:.1f} GB**" in table and "keep the Hugging Face cache on the Colab VM's own disk" in table
    colab = (Path(__file__).resolve().parents[1] / "docs" / "colab.md").read_text()
    assert f"{total / 1e9:.1f} GB" in colab, "docs/colab.md's download figure is the profile's"
    assert drive_warning("t4", {"HF_HOME": "/content/drive/MyDrive/hf"}).startswith(
        "warning: the Hugging Face cache is on Google Drive"
    )
    assert drive_warning("t4", {"HF_HOME": "/root/.cache/huggingface"}) is None


def test_the_t4_time_estimate_adds_up_from_its_parts_and_is_the_t4_pages():
    """docs/t4.md's T4 time is `estimate.t4_time`'s output, so it cannot drift from the profile; its parts
    follow the profile's sizes (twice the tokens in 04: its generations cost more)."""
    from dataclasses import replace
    from pathlib import Path

    from specnb.notebook import estimate as est

    table = est.t4_time("t4")
    assert set(table["notebook"]) == {"set-up", "01", "02", "03", "04", "05", "06"}
    assert (table["seconds"] >= 0).all() and abs(
        table["seconds"].sum() - (table["count"] * table["each_s"]).sum()
    ) < 1e-6
    t4_page = (Path(__file__).resolve().parents[1] / "docs" / "t4.md").read_text()
    assert est.t4_markdown("t4") in t4_page, "docs/t4.md's T4 estimate is this module's output"
    c = est.Costs(est.T4Figures.published())
    step = c.step("meta-llama/Llama-2-7b-hf", "4bit")
    assert 0.1 < step < 0.2  # ~2x Qwen2.5-3B's 60.8 ms: about twice its nf4 bytes
    assert abs(c.verify("meta-llama/Llama-2-7b-hf", "4bit", 8) / step - 1.6) < 1e-9  # the published 8-row point
    slower = est.t4_time("t4", replace(est.T4Figures.published(), tau=1.25))
    assert slower["seconds"].sum() > table["seconds"].sum()


def test_one_command_gives_each_notebooks_time_on_a_t4_or_a_cpu_and_its_memory(capsys):
    """`python -m specnb.notebook.estimate`: the T4 time from published figures, a CPU's from the profile's
    reference runs scaled by a decode step (only the notebooks the profile runs), the memory table."""
    from specnb.notebook import estimate as est

    assert est.main(["time", "t4"]) == 0 and est.t4_markdown("t4") in capsys.readouterr().out
    reference = est.reference(["course", "cpu"])[1]
    assert est.main(["time", "course", "--device", "cpu", "--decode-ms", str(2 * reference.decode_ms)]) == 0
    said = capsys.readouterr().out
    assert "01_tree_shapes" in said and "04_long_generation" not in said, "course runs 01-03 and 07 only"
    assert f"{2 * reference.decode_ms:.0f} ms (given)" in said
    assert est.main(["memory", "t4"]) == 0 and est.memory_markdown("t4") in capsys.readouterr().out
    assert est.main(["time", "no-such-profile"]) == 2 and "no-such-profile" in capsys.readouterr().err
    assert est.main(["time", "t4", "--device", "cpu"]) == 2 and "--device t4" in capsys.readouterr().err
    assert est.main(["time", "t4", "--decode-ms", "100"]) == 2 and "--device cpu" in capsys.readouterr().err
    assert est.main(["time", "cpu", "-f", "x.yaml"]) == 2 and "-f changes no CPU time" in capsys.readouterr().err
    assert est.main(["memory", "cpu", "--device", "cpu", "--usable-gb", "5"]) == 0
    said = capsys.readouterr().out  # the cpu profile's models in float32, sized against 5 GB
    assert "fits in 5 GB" in said and "on a CPU, models in float32" in said and "**NO**" in said
