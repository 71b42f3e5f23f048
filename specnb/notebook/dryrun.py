"""Stand-in models for a dry run of a hub-model profile (`t4`) on a CPU with no model hub.

For every hub id the profile names, a tiny random model with the real model's architecture class,
vocabulary size, special token ids, rope settings and tied-or-untied embeddings (from
`io.model_configs`), and a tokenizer with the real vocabulary size, are installed into a local
Hugging Face hub cache. With HF_HUB_OFFLINE=1 and HF_HOME=<home>, `io.models.load_model(hub_id,
"4bit")` then resolves the id through `io.sources` (status "cached") and loads it exactly as it
would load the real one: the same calls, the same 4-bit path, the same pair checks.

What it holds:
    StandinShape, FAMILY_SHAPES   the tiny sizes of each tokenizer family's stand-ins
    tiny_heads                    query / key-value heads and head size keeping the real GQA ratio
    standin_config                a hub model's config at stand-in size (everything else real)
    family_tokenizer              one tokenizer per family, shared by its members (equal vocabularies)
    standin_weights               seeded weights: members of a family share base weights plus their
                                  own noise, so a draft agrees with its target often, not always
    install_standins              the hub-cache layout, built once (a stamp; rebuilt when this code,
                                  the configs or the library versions change), never over a real model;
                                  published Medusa and EAGLE heads too, in their layout and dtype, at
                                  the size of their base model's stand-in
    main                          `python -m specnb.notebook.dryrun build --home DIR [HUB_ID ...]`

Tokenizers, built with the `tokenizers` library from a BPE trained on specnb's built-in prompts and a
little built-in text, padded with never-produced `<unusedN>` tokens up to the exact size:
    llama2   32000: <unk> <s> </s>, byte-fallback tokens <0x00>..<0xFF>, then SentencePiece-style
             pieces (Metaspace "▁", prepended to the first word), as Llama-2's tokenizer.json lays out
    llama3   128256: byte-level BPE with Llama 3's split pattern, 128000 regular tokens, then the 256
             special tokens at their real ids (<|begin_of_text|> 128000 ... <|eot_id|> 128009)
Both encode and decode any text (unknown characters fall back to bytes). The members of a family get
the same vocabulary, so `io.models.check_pair` accepts Llama-160M -> Llama-2-7B and refuses
Llama-3.2-1B -> Llama-2-7B for the real reason: 128256 tokens against 32000.

Sizes: bitsandbytes' CPU 4-bit kernel packs weights in blocks of 32 output rows and 64-value
absmax blocks, so every Linear's input and output sizes are multiples of 64 (hidden 64 or 192,
two layers). Llama-3.2-3B's 3 : 1 query to key-value heads needs a hidden size divisible by 3, so
the llama3 family uses 192.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerFast

from ..drafters.eagle import EagleHead
from ..io.checkpoints import PublishedCheckpoint
from ..io.eagle_checkpoint import PublishedEagle
from ..io.medusa_checkpoint import PublishedHeads, save_checkpoint
from ..io.model_configs import FAMILIES, HubModel, config_of, hub_model, known_models
from ..io.prompts import BUILTIN
from ..io.published import published_checkpoints
from ..io.storage import read_json, write_json

STAMP = "specnb-standins.json"  # in <home>/hub: what was built, from which code
MARKER = "specnb-standin.json"  # in every stand-in snapshot: never overwrite a folder without it
MEMBER_NOISE = 0.05  # a member's own weights, relative to the family's: drafts agree often, not always
ATTENTION_GAIN, MLP_GAIN = 0.2, 3.0  # output scale of attention and MLP projections (see standin_weights)
LOGIT_STD = 4.0  # spread of the logits (the final norm's weight sets it): peaked, not one-hot
UNUSED = "<unused{}>"  # filler tokens up to the real vocabulary size; BPE never produces them

# A little English beyond the prompts, so the BPE learns common words.
TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times. "
    "In the beginning the model reads the prompt, then it writes one token after another. A draft "
    "model guesses several tokens, and the target checks them all at once; what it accepts is kept. "
    "def main():\n    print('hello, world')\n    return 0\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 20 42 100 1829 2024. Questions? Answers! Lists: a, b; c.\n"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]  # ids 128000 .. 128255


@dataclass(frozen=True)
class StandinShape:
    hidden: int  # multiple of 64 (and of the query heads)
    intermediate: int  # multiple of 64
    layers: int


FAMILY_SHAPES: dict[str, StandinShape] = {
    "llama2": StandinShape(hidden=64, intermediate=192, layers=2),
    "llama3": StandinShape(hidden=192, intermediate=384, layers=2),  # 192: divisible by 3 heads (3B's ratio)
}


def tiny_heads(heads: int, kv_heads: int) -> tuple[int, int, int]:
    """(query heads, key-value heads, head size) at stand-in size with the real ratio: 4 / 4 x 16 for
    multi-head attention, one key-value head of 64 and ratio x as many query heads for GQA (every
    projection then maps to a multiple of 64)."""
    if heads % kv_heads:
        raise ValueError(f"{heads} heads are not a multiple of {kv_heads} key-value heads")
    ratio = heads // kv_heads
    return (4, 4, 16) if ratio == 1 else (ratio, 1, 64)


def standin_config(model: HubModel) -> PretrainedConfig:
    """The real config (`io.model_configs`) with the stand-in's sizes; vocabulary, special ids,
    rope, tying and everything else stay as they are."""
    config = config_of(model.hub_id)
    shape = FAMILY_SHAPES[model.tokenizer.family]
    heads, kv_heads, head_dim = tiny_heads(config.num_attention_heads, config.num_key_value_heads)
    if shape.hidden % heads or any(
        n % 64 for n in (shape.hidden, shape.intermediate, heads * head_dim, kv_heads * head_dim)
    ):
        raise ValueError(f"stand-in sizes of {model.hub_id} do not suit bitsandbytes' CPU kernel")
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = (
        shape.hidden,
        shape.intermediate,
        shape.layers,
    )
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = heads, kv_heads, head_dim
    config.specnb_standin = f"tiny random stand-in for {model.hub_id} (specnb.notebook.dryrun), not the real model"
    return config


# ---------------------------------------------------------------------------------------------
# Tokenizers


def family_tokenizer(family: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """The family's tokenizer, exactly `vocab_size` tokens (special tokens included)."""
    text = [p.text for p in BUILTIN] + [TRAINING_TEXT]
    if family == "llama2":
        split = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
        trained = _train_bpe(split, text, alphabet=[])
        special = ["<unk>", "<s>", "</s>"]
        vocab = {t: i for i, t in enumerate(special + [f"<0x{b:02X}>" for b in range(256)])}
        vocab = _fill(vocab, trained["vocab"], vocab_size)
        tok = Tokenizer(
            models.BPE(vocab=vocab, merges=trained["merges"], unk_token="<unk>", byte_fallback=True, fuse_unk=True)
        )
        # Llama-2's tokenizer.json: no split on spaces, "▁" before the first word; decoding undoes both
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        bos, eos, unk = "<s>", "</s>", "<unk>"
    elif family == "llama3":
        split = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        trained = _train_bpe(split, text, alphabet=pre_tokenizers.ByteLevel.alphabet())
        special = LLAMA3_SPECIAL
        vocab = _fill({}, trained["vocab"], vocab_size - len(special))
        tok = Tokenizer(models.BPE(vocab=vocab, merges=trained["merges"], ignore_merges=False))
        tok.pre_tokenizer = split
        tok.decoder = decoders.ByteLevel()
        bos, eos, unk = "<|begin_of_text|>", "<|end_of_text|>", None
    else:
        raise ValueError(f"unknown tokenizer family {family!r}; known: {FAMILIES}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    bos_id = tok.token_to_id(bos)
    template = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tok.post_processor = (
        processors.Sequence([processors.ByteLevel(trim_offsets=False), template]) if family == "llama3" else template
    )
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"{family} tokenizer has {tok.get_vocab_size()} tokens, not {vocab_size}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk)


def _train_bpe(pre_tokenizer: pre_tokenizers.PreTokenizer, text: list[str], alphabet: list[str]) -> dict:
    """vocab (in the trainer's order) and merges of a small BPE trained on `text` (deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=1000, show_progress=False, initial_alphabet=alphabet))
    model = json.loads(tok.to_str())["model"]
    return {"vocab": sorted(model["vocab"], key=model["vocab"].get), "merges": [tuple(m) for m in model["merges"]]}


def _fill(vocab: dict[str, int], tokens: Sequence[str], size: int) -> dict[str, int]:
    """`vocab` + the trained tokens not in it, then UNUSED fillers up to `size` entries."""
    vocab = dict(vocab)
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    i = 0
    while len(vocab) < size:
        vocab.setdefault(UNUSED.format(i), len(vocab))
        i += 1
    return vocab


# ---------------------------------------------------------------------------------------------
# Weights


def standin_weights(model: torch.nn.Module, hub_id: str, family: str) -> None:
    """Seeded weights, in place. Embeddings and LM head: the family's own (unit normal), shared by
    every member. Each projection: the family's matrix of that name and shape plus MEMBER_NOISE times
    the member's own, scaled by a gain over sqrt(fan-in); attention is kept weak and the MLP strong,
    so a member's next token depends mostly on what every member shares (a draft of another shape,
    Llama-3.2-1B for -3B, still agrees often) and a tied embedding does not just repeat the last
    token. RMSNorm weights 1, the final one sqrt(hidden) / LOGIT_STD smaller: logits spread LOGIT_STD."""
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head is the embedding: set once
            if p.ndim == 1:
                p.fill_(LOGIT_STD / math.sqrt(p.shape[0]) if name == "model.norm.weight" else 1.0)
                continue
            shape = "x".join(map(str, p.shape))
            shared = _normal(f"{family}/{name}/{shape}", p.shape)
            if name.endswith(("embed_tokens.weight", "lm_head.weight")):
                p.copy_(shared)
                continue
            gain = ATTENTION_GAIN if ".self_attn." in name else MLP_GAIN
            own = _normal(f"{hub_id}/{name}/{shape}", p.shape)
            p.copy_((shared + MEMBER_NOISE * own) * gain / math.sqrt((1 + MEMBER_NOISE**2) * p.shape[1]))


def _normal(key: str, shape: torch.Size) -> torch.Tensor:
    return torch.randn(
        shape, generator=torch.Generator().manual_seed(zlib.crc32(key.encode()))
    )  # host: stand-in weights, saved to disk


# ---------------------------------------------------------------------------------------------
# The hub cache


def repo_folder(home: Path, hub_id: str) -> Path:
    """<home>/hub/models--org--name, as huggingface_hub lays out its cache."""
    return Path(home) / "hub" / ("models--" + hub_id.replace("/", "--"))


def standin_digest(hub_ids: Iterable[str]) -> str:
    """What the stand-ins are built from: this module, the committed configs, the library versions."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for hub_id in sorted(hub_ids):
        h.update(repr(published_checkpoints().get(hub_id) or hub_model(hub_id)).encode())
    for package in ("torch", "transformers", "tokenizers", "safetensors"):
        h.update(f"{package}=={metadata.version(package)}".encode())
    return h.hexdigest()


def install_standins(home: str | Path, hub_ids: Iterable[str] | None = None) -> dict[str, Path]:
    """Stand-ins of `hub_ids` in `<home>/hub`; hub id -> snapshot. Default: every committed model and
    every published head checkpoint whose base model is committed. A hub id may name published
    Medusa or EAGLE heads (`io.published.published_checkpoints`): their stand-in is a checkpoint in
    the published layout and dtype, sized for their base model's stand-in.

    Idempotent: a stamp in <home>/hub records the digest it was built from; an unchanged digest
    returns at once. A folder of the cache that is not a stand-in (no MARKER) is never touched: then
    this raises, since that cache holds real downloads and is not the place for stand-ins."""
    home = Path(home).expanduser()
    known, published = known_models(), published_checkpoints()
    buildable = [r for r, h in published.items() if h.base_model in known]  # sized by their base's stand-in
    hub_ids = sorted(set(hub_ids if hub_ids is not None else known + buildable))
    unknown = [h for h in hub_ids if h not in known and h not in buildable]
    if unknown:
        raise KeyError(
            f"no committed config for {unknown} (or for the base model of published heads); stand-ins exist "
            f"for {known} and the published heads {buildable}"
        )
    digest = standin_digest(hub_ids)
    commit = digest[:40]  # the snapshot's "commit hash"
    hub = home / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    with _locked(hub / ".specnb-standins.lock"):
        snapshots = {h: repo_folder(home, h) / "snapshots" / commit for h in hub_ids}
        stamp = read_json(hub / STAMP)
        if stamp.get("digest") == digest and all((s / MARKER).is_file() for s in snapshots.values()):
            return snapshots
        for h in hub_ids:
            _refuse_real_model(repo_folder(home, h))
        tokenizers = {}
        for h in [h for h in hub_ids if h in published]:
            _install_repo(home, h, commit, partial(_fill_published, published[h]))
        for h in [h for h in hub_ids if h not in published]:
            model = hub_model(h)
            family = model.tokenizer.family
            if family not in tokenizers:
                tokenizers[family] = family_tokenizer(family, model.vocab_size)
            _install_repo(home, h, commit, partial(_fill_model, model, tokenizers[family]))
        write_json(hub / STAMP, {"digest": digest, "models": hub_ids})
    return snapshots


def _install_repo(home: Path, hub_id: str, commit: str, fill: Callable[[Path], str]) -> None:
    """One repository: refs/main -> commit, snapshots/<commit>/ written by `fill` (which returns what
    the stand-in is), and the marker. Written beside, then renamed."""
    repo = repo_folder(home, hub_id)
    repo.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=repo.parent, prefix=f".{repo.name}.", suffix=".tmp"))
    try:
        snapshot = tmp / "snapshots" / commit
        snapshot.mkdir(parents=True)
        what = fill(snapshot)
        write_json(snapshot / MARKER, {"hub_id": hub_id, "what": what, "commit": commit})
        (tmp / "refs").mkdir()
        (tmp / "refs" / "main").write_text(commit)
        if repo.exists():
            shutil.rmtree(repo)
        os.replace(tmp, repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fill_model(model: HubModel, tokenizer: PreTrainedTokenizerFast, snapshot: Path) -> str:
    """The model, its tokenizer and the generation config where the real one is recorded."""
    config = standin_config(model)
    dtype = getattr(torch, str(model.config.get("torch_dtype", "float32")))
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    standin_weights(net, model.hub_id, model.tokenizer.family)
    net.to(dtype).save_pretrained(snapshot)
    (snapshot / "generation_config.json").unlink(missing_ok=True)  # only the real one, where recorded
    if model.generation_config is not None:
        write_json(snapshot / "generation_config.json", model.generation_config)
    facts = model.tokenizer
    tokenizer.chat_template = facts.chat_template
    if facts.pad_token is not None:
        tokenizer.pad_token = facts.pad_token
    tokenizer.save_pretrained(snapshot)
    settings = read_json(snapshot / "tokenizer_config.json")
    settings.update(tokenizer_class=facts.tokenizer_class, add_bos_token=facts.add_bos_token)
    write_json(snapshot / "tokenizer_config.json", settings)
    return config.specnb_standin


def _fill_published(checkpoint: PublishedCheckpoint, snapshot: Path) -> str:
    if isinstance(checkpoint, PublishedHeads):
        return _fill_heads(checkpoint, snapshot)
    if isinstance(checkpoint, PublishedEagle):
        return _fill_eagle(checkpoint, snapshot)
    raise TypeError(f"no stand-in for {type(checkpoint).__name__}")


def _fill_heads(heads: PublishedHeads, snapshot: Path) -> str:
    """Published Medusa heads at the size of their base model's stand-in, in their layout and dtype:
    weak seeded residual blocks, and projections near the family's LM head (so the heads' logits
    are those of a language model, not noise)."""
    base = hub_model(heads.base_model)
    config = standin_config(base)
    h, v = config.hidden_size, config.vocab_size
    lm_head = _normal(f"{base.tokenizer.family}/lm_head.weight/{v}x{h}", torch.Size((v, h)))
    state = {}
    for k in range(heads.num_heads):
        for layer in range(heads.num_layers):
            state[f"{k}.{layer}.linear.weight"] = (
                _normal(f"{heads.repo_id}/{k}.{layer}", torch.Size((h, h))) * 0.1 / math.sqrt(h)
            )
            state[f"{k}.{layer}.linear.bias"] = torch.zeros(h)  # host: stand-in weights, saved to disk
        state[f"{k}.{heads.num_layers}.weight"] = lm_head + MEMBER_NOISE * _normal(
            f"{heads.repo_id}/{k}", torch.Size((v, h))
        )
    save_checkpoint(snapshot, state, heads.base_model, dtype=heads.torch_dtype)
    return f"tiny random stand-in for {heads.repo_id} ({heads.num_heads} heads, {heads.dtype}; specnb.notebook.dryrun)"


def _fill_eagle(head: PublishedEagle, snapshot: Path) -> str:
    """A published EAGLE-1 head for its base model's stand-in, in its layout and dtype
    (`io.eagle_checkpoint`, written by `EagleHead.save`; with the family's embedding where the
    published file holds it). fc passes the embedding half through, plus weak seeded noise over
    both halves, and the layer is the stand-in base model's first layer: the stand-ins nearly
    follow the last token alone, so the head's logits for the token after next are a language
    model's, and now and then the target's (drafting with it runs, with a few drafts accepted)."""
    base = hub_model(head.base_model)
    net = AutoModelForCausalLM.from_config(standin_config(base), dtype=torch.float32)
    standin_weights(net, base.hub_id, base.tokenizer.family)
    eagle = EagleHead.from_target(net, bias=head.bias)
    h = net.config.hidden_size
    with torch.no_grad():
        eagle.fc.weight.copy_(_normal(f"{head.repo_id}/fc.weight", eagle.fc.weight.shape) * 0.1 / math.sqrt(2 * h))
        eagle.fc.weight[:, :h] += torch.eye(
            h
        )  # host: stand-in weights; the embedding half of concat(embedding, feature)
        if eagle.fc.bias is not None:
            eagle.fc.bias.zero_()
    first = net.model.layers[0].state_dict()
    eagle.layer.load_state_dict({k: v for k, v in first.items() if not k.startswith("input_layernorm.")})
    eagle.save(snapshot, head.base_model, head.torch_dtype, embedding=head.holds_embedding)
    return f"tiny random stand-in for {head.repo_id} (EAGLE-1 head, {head.dtype}; specnb.notebook.dryrun)"


def _refuse_real_model(repo: Path) -> None:
    if not repo.exists():
        return
    snapshots = [p for p in (repo / "snapshots").glob("*") if p.is_dir()]
    if not snapshots or not all((s / MARKER).is_file() for s in snapshots):
        raise RuntimeError(
            f"{repo} holds a model that is not a specnb stand-in: refusing to replace it. "
            "Build stand-ins into a folder of their own (HF_HOME for the dry run only)."
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (parallel test processes share the cache)."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m specnb.notebook.dryrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="install stand-ins into HOME/hub (use HF_HOME=HOME HF_HUB_OFFLINE=1 to load them)")
    b.add_argument("--home", type=Path, required=True, help="a folder of its own, never your real HF_HOME")
    b.add_argument(
        "hub_ids",
        nargs="*",
        metavar="HUB_ID",
        help=f"default: all of {', '.join(known_models())}, and the published heads (Medusa's, EAGLE's) "
        "of those models",
    )
    args = ap.parse_args(argv)
    try:
        built = install_standins(args.home, args.hub_ids or None)
    except (KeyError, RuntimeError) as e:
        print(f"dryrun: {e}", file=sys.stderr)
        return 2
    for hub_id, snapshot in built.items():
        print(f"{hub_id}: {snapshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
