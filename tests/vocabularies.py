"""Two hand-made tokenizers with different vocabularies, and tiny models over them, for the
cross-tokenizer tests (built in code: nothing is downloaded).

    target_tokenizer()  byte-level BPE, GPT-2 / Llama-3 / Qwen2 style ('Ġ' is a space, every byte a
                        symbol), 278 tokens
    draft_tokenizer()   SentencePiece-style BPE, Llama-2 style ('▁' is a space, a dummy prefix
                        space on the first word, <0xNN> byte fallback), 306 tokens

Words split differently in each: " hello the cat" is T `Ġhel|lo|Ġthe|Ġcat`, D `▁he|llo|▁the|▁ca|t`;
"é" is T `Ã|©`, D `<0xC3>|<0xA9>`; D writes "the cat" as `▁the|▁ca|t`, so a committed `▁c`
followed by "at" is a join the tokenizer would merge.

`bigram_llama` is a Llama whose attention and MLP outputs are zero and whose embeddings are
one-hot, so its next-token logits depend on the current token only: logits[a] = `hot` at the
token that follows a in `text` (read cyclically), `cold` at the other tokens of `text`, -1e4
elsewhere. Its distributions are exactly known, peaked (hot 8) or flat (hot 1).
"""

from __future__ import annotations

import math

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS_T = ["Ġthe", "Ġhel", "hel", "lo", "Ġcat", "Ġsat", "Ġon", "Ġmat", "at"]  # merges in rank order
WORDS_D = ["▁the", "▁he", "he", "llo", "▁ca", "t", "▁sat", "▁on", "▁mat", "▁c"]
TEXT = " hello the cat sat on the mat"  # both models' bigram text
T_VOCAB, D_VOCAB = 320, 384  # config vocab sizes (padded): they must differ for transformers' UAG


def _merges(words: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Left-to-right merges that build each word; every intermediate symbol joins the vocabulary."""
    merges: list[tuple[str, str]] = []
    for word in words:
        current = word[0]
        for ch in word[1:]:
            if (current, ch) not in merges:
                merges.append((current, ch))
            current += ch
            vocab.setdefault(current, len(vocab))
    return merges


def target_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges(WORDS_T, vocab)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    end = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=end, bos_token=end, pad_token=end)


def draft_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for c in "▁abcdefghijklmnopqrstuvwxyz.,":
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=_merges(WORDS_D, vocab), unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


def bigram_llama(
    tokenizer, text: str, vocab_size: int, hot: float = 8.0, cold: float = 0.0, seed: int = 0
) -> LlamaForCausalLM:
    """vocab_size >= len(tokenizer), a multiple of 4 (RoPE needs an even head size)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=vocab_size,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    used = sorted(set(ids))
    logits = torch.full((vocab_size, vocab_size), -1e4)
    logits[:, used] = cold
    for a, b in zip(ids, ids[1:] + ids[:1]):
        logits[a, b] = hot
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(vocab_size))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.copy_(logits.T / math.sqrt(vocab_size))  # RMSNorm(one-hot) = sqrt(H) * one-hot
    model.generation_config.eos_token_id = None
    return model
