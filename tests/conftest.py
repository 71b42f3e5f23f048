"""Seeded tiny models built from a config (transformers' test habit): they download nothing and
odd sizes catch shape bugs. `scale` multiplies the LM head so random models have peaked,
distinguishable next-token distributions instead of near-uniform ones."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parents[1]

# notebook runs in the tests: a cell that runs past this fails its run with a clear error
# (specnb.notebook.runner.cell_timeout) instead of waiting on a kernel that stopped answering
os.environ.setdefault("SPECNB_CELL_TIMEOUT", "600")


def tiny_model(
    seed: int,
    vocab: int = 61,
    arch: str = "llama",
    attn: str = "sdpa",
    scale: float = 1.0,
    layers: int = 2,
    hidden: int = 48,
) -> torch.nn.Module:
    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden + 4,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs, attn_implementation=attn))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs, attn_implementation=attn))
    else:
        raise ValueError(arch)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()


def step_tuple(s) -> tuple:
    """What a step did, to compare a replayed step with a real one: position, drafted, accepted,
    tokens added, tree depth, the accepted ranks and the children counts."""
    return (s.position, s.num_drafted, s.num_accepted, s.num_tokens, s.tree_depth, s.accepted_ranks, s.child_counts)


def random_prompt(seed: int, length: int = 7, vocab: int = 61) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, length), generator=g)  # ids 0-2 are pad/bos/eos


# transformers' deprecations that go through its logger, not `warnings` (pytest.ini makes the others
# errors): each one a test triggers through specnb's calls fails that test
LOGGED_DEPRECATIONS = ("is deprecated", "Ignoring clean_up_tokenization_spaces")


class _Deprecations(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(p in message for p in LOGGED_DEPRECATIONS):
            self.seen.append(message)


@pytest.fixture(autouse=True)
def no_logged_deprecations():
    handler = _Deprecations()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not handler.seen, f"transformers logged a deprecation for specnb's call: {handler.seen[0][:300]}"


@pytest.fixture(scope="session")
def tiny_target() -> torch.nn.Module:
    return tiny_model(0, scale=30.0)


@pytest.fixture(scope="session")
def tiny_draft() -> torch.nn.Module:
    """A different random model: agrees with the target now and then."""
    return tiny_model(1, scale=30.0, layers=1)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (embedded GGUF) and its tokenizer, loaded once per session: de-quantizing
    the GGUF takes ~20 s. Shared: tests copy it before changing it."""
    from specnb.io.models import load_model

    return load_model("smollm2-135m")


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


def user_clone(dest: Path) -> Path:
    """`git clone` of this checkout into `dest`, with the working tree's uncommitted changes laid
    over it (modified, new and deleted files) and committed there, so that the clone is what
    committing would land."""
    try:
        git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, nothing to clone: {e}")
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    for name in git("ls-files", "-z", "--modified", "--others", "--exclude-standard").split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for name in git("ls-files", "-z", "--deleted").split("\0"):
        if name:
            (dest / name).unlink(missing_ok=True)
    if git("status", "--porcelain", cwd=dest):  # committed there, so a clone of the clone has them too
        git("add", "-A", cwd=dest)
        git(
            "-c",
            "user.name=specnb tests",
            "-c",
            "user.email=tests@specnb.invalid",
            "commit",
            "-q",
            "-m",
            "the working tree's uncommitted changes",
            cwd=dest,
        )
    return dest
