"""Text across vocabularies: tokens as bytes, the look-behind rule, and text re-encoded after
committed tokens without touching them. The cross-tokenizer drafter (`drafters.cross_tokenizer`)
is built on it; nothing here loads a model.

What it holds:
    TokenText      a tokenizer's tokens as bytes (special tokens have none: they are barriers),
                   read from its decoder: byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM2: each
                   byte a symbol) or SentencePiece-style BPE ('▁' for a space, <0xNN> byte
                   fallback: Llama-2); checked by round trips when it is built
    window_start   the look-behind rule: where re-encoding may start
    continue_text  tokens for new bytes after committed tokens, the committed tokens unchanged
    Mirror         one tokenizer's tokens of another tokenizer's sequence, kept up to date window
                   by window (the draft's view of what the target committed)

Text is handled as bytes, joined from the tokens' byte pieces, never through `decode`: a decoded
lone token can lose its leading space (SentencePiece strips it) or turn half a character into
U+FFFD, and either would shift every offset after it.

The look-behind rule. The boundary before token i of a sequence is *safe* when i = 0, when token i
or token i - 1 is a special token, or when token i's text starts with a space and the byte before
it is not whitespace. At a safe boundary every pre-tokenizer of the two families starts a new
pre-token whatever text follows: the GPT-2, Llama-3 and Qwen2 split patterns never put a non-space
character and a following space into one pre-token, and no SentencePiece piece holds a non-space
character followed by '▁'. BPE never merges across pre-tokens, so the text from a safe boundary on
tokenizes alone exactly as it does inside the whole text. Re-encoding therefore starts at the last
safe boundary (at most `lookbehind` tokens back): enough already-committed context that the join
between committed and new text comes out as the tokenizer would cut it. transformers' universal
assisted generation uses fixed windows of 10 tokens instead (`assistant_lookbehind`,
`target_lookbehind`) and aligns the two encodings by their longest common run of tokens.

Limits (each costs acceptance only, never exactness: the target verifies every proposal):
    - a text with no safe boundary in the last `lookbehind` tokens (a long run with no space) is
      re-encoded from a cut that may split a pre-token;
    - tokenizers with normalizers that change text (lowercasing, NFKC) are refused; NFC (Qwen2) is
      accepted, and a non-NFC text whose bytes do not survive encoding contributes nothing;
    - a committed token that merges with new text (the target wrote `▁c`, the draft's text goes on
      with `at`) cannot be re-merged: the new text is encoded after a neutral newline instead,
      text-correct but not always the split the target would choose;
    - Unigram and WordPiece tokenizers have no byte rule here and are refused.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")
ANCHOR = b"\n"  # neutral left context: a newline ends every pre-token and joins with nothing after it
# strings whose encoding must give back their own bytes (a leading space, digits, code, non-ASCII)
ROUND_TRIPS = (
    "Hello world",
    " two  spaces\nand a newline",
    "x = f(1, 2)  # ok",
    "caf\u00e9 na\u00efve",
    "\u4f60\u597d 42",
)


@dataclass(frozen=True, eq=False)
class TokenText:
    """A tokenizer's tokens as bytes; build it with `TokenText.of(tokenizer)`."""

    name: str
    tokenizer: Any  # a transformers fast tokenizer (its `backend_tokenizer` encodes)
    pieces: tuple[bytes | None, ...]  # id -> the token's bytes; None for a special token
    specials: Mapping[str, int]  # content -> id of every special token
    byte_token: Mapping[int, int]  # byte value -> a token of exactly that one byte
    bos: int | None  # the BOS the tokenizer puts before every text (None: it adds none)
    eos: int | None
    prefix_space: bool  # a text that does not start with a space is encoded with one in front
    #                     (SentencePiece's dummy prefix); its bytes count in `continue_text`

    @classmethod
    def of(cls, tokenizer: Any) -> TokenText:
        """Byte pieces from the tokenizer's decoder type, then round trips: a tokenizer whose
        tokens do not give back the bytes of the text they encode is refused (ValueError)."""
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or backend.decoder is None:
            raise ValueError(f"tokenizer {name!r}: a fast tokenizer with a decoder is needed to read tokens as bytes")
        kinds = _decoder_kinds(json.loads(backend.decoder.__getstate__()))
        vocab = tokenizer.get_vocab()
        added = dict(tokenizer.added_tokens_decoder)
        size = max(max(vocab.values()), max(added, default=-1)) + 1
        pieces: list[bytes | None] = [None] * size
        if "ByteLevel" in kinds:
            table = _byte_decoder()
            for piece, i in vocab.items():
                if all(c in table for c in piece):
                    pieces[i] = bytes(table[c] for c in piece)
        elif kinds & {"ByteFallback", "Metaspace", "Replace"}:
            for piece, i in vocab.items():
                if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                    pieces[i] = bytes([int(piece[3:5], 16)])
                else:
                    pieces[i] = piece.replace("\u2581", " ").encode()
        else:
            raise ValueError(
                f"tokenizer {name!r}: decoder {sorted(kinds)} has no byte rule (byte-level BPE or "
                "SentencePiece-style BPE are supported)"
            )
        specials = {}
        for i, token in added.items():
            if token.special:
                pieces[i] = None
                specials[token.content] = i
            else:
                pieces[i] = token.content.encode()
        byte_token: dict[int, int] = {}
        for i, piece in enumerate(pieces):
            if piece is not None and len(piece) == 1:
                byte_token.setdefault(piece[0], i)
        probe = tokenizer("a")["input_ids"]
        bos = tokenizer.bos_token_id if probe and probe[0] == tokenizer.bos_token_id else None
        out = cls(name, tokenizer, tuple(pieces), specials, byte_token, bos, tokenizer.eos_token_id, False)
        first = out.join(out.encode("a"))
        object.__setattr__(out, "prefix_space", first == b" a")
        for text in ROUND_TRIPS:
            for s in (text, " " + text):
                got = out.join(out.encode(s))
                want = (b" " if out.prefix_space and not s.startswith(" ") else b"") + s.encode()
                if got != want:
                    raise ValueError(
                        f"tokenizer {name!r}: the tokens of {s!r} give back {got!r}, not {want!r}; "
                        "its normalizer or pre-tokenizer changes text, which cross-tokenizer drafting needs unchanged"
                    )
        return out

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        return self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.backend_tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def join(self, ids: Sequence[int]) -> bytes:
        """The bytes of text tokens (a special token here is an error: it has none)."""
        return b"".join(self.pieces[i] for i in ids)  # type: ignore[misc]

    def piece(self, token: int) -> bytes | None:
        """The token's bytes; None for a special token or an id past the tokenizer (a model's padding)."""
        return self.pieces[token] if 0 <= token < len(self.pieces) else None

    def is_special(self, token: int) -> bool:
        return self.piece(token) is None


def map_specials(source: TokenText, dest: TokenText) -> dict[int, list[int]]:
    """Each special token of `source` as `dest` tokens: the special of the same content, else by
    role (BOS to BOS, EOS to EOS), else the special's content encoded as text."""
    out = {}
    for content, i in source.specials.items():
        if content in dest.specials:
            out[i] = [dest.specials[content]]
        elif i == source.tokenizer.bos_token_id and dest.tokenizer.bos_token_id is not None:
            out[i] = [dest.tokenizer.bos_token_id]
        elif i == source.eos and dest.eos is not None:
            out[i] = [dest.eos]
        else:
            out[i] = dest.encode(content)
    return out


def window_start(pieces: Sequence[bytes | None], lookbehind: int) -> int:
    """Where re-encoding starts: the index of the last safe boundary among the last `lookbehind`
    tokens (pieces: a sequence's tokens as bytes, None for specials; right after a special when the
    last one is a special), or the cut `lookbehind` tokens back when there is none."""
    end = len(pieces)
    stop = max(end - lookbehind, 0)
    for i in range(end - 1, stop - 1, -1):
        piece, previous = pieces[i], pieces[i - 1] if i else None
        if piece is None:
            return i + 1
        if i == 0 or previous is None:
            return i
        if previous and piece[:1] == b" " and previous[-1] not in WHITESPACE:
            return i
    return stop


def complete_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is valid UTF-8, as text."""
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        return data[: e.start].decode()


def continue_text(vocab: TokenText, left: bytes, new: Sequence[bytes]) -> list[list[int] | None]:
    """For each of `new`: the tokens that write those bytes after committed text whose last tokens
    are `left` (their bytes, from a safe boundary on), the committed tokens left as they are.

    left + new is encoded as one text, the tokens that cover `left` are dropped by byte count
    (SentencePiece's dummy prefix counted), and the rest is the answer when a token boundary falls
    exactly at the join. When the tokenizer would merge across the join (committed `▁c`, new
    `at`), or `left` is not valid UTF-8, the new bytes are encoded after a neutral newline instead;
    a character the committed text left half-written is first finished with single-byte tokens.
    A new text is cut after its last complete character. None: no tokens write it (it does not
    finish the committed half character, or the tokenizer changed its bytes)."""
    valid, partial = _tail(left)
    texts = [complete_prefix(left + data) if valid else "" for data in new]
    batch = [k for k, text in enumerate(texts) if len(text.encode()) > len(left)]
    encoded = vocab.encode_batch([texts[k] for k in batch]) if batch else []
    out: list[list[int] | None] = [None] * len(new)
    for k, ids in zip(batch, encoded):
        out[k] = _after(vocab, left, texts[k].encode(), ids)
    for k, data in enumerate(new):
        if out[k] is None:
            out[k] = _after_anchor(vocab, partial, data)
    return out


def _tail(left: bytes) -> tuple[bool, bytes]:
    """(left is valid UTF-8 but for an unfinished last character, that character's bytes)."""
    try:
        left.decode()
        return True, b""
    except UnicodeDecodeError as e:
        if e.end == len(left) and e.reason == "unexpected end of data":
            return True, left[e.start :]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        decoder.decode(left, final=False)
        return False, decoder.getstate()[0]


def _after(vocab: TokenText, left: bytes, whole: bytes, ids: list[int]) -> list[int] | None:
    """ids encode `whole` = left + new: the ones after `left`, or None if none starts at the join."""
    pieces = [vocab.pieces[i] if i < len(vocab.pieces) else None for i in ids]
    if any(p is None for p in pieces):
        return None
    got = b"".join(pieces)  # type: ignore[arg-type]
    virtual = len(got) - len(whole)
    if virtual not in (0, 1) or got[virtual:] != whole or got[:virtual] not in (b"", b" "):
        return None  # a normalizer changed the text
    pos, k = -virtual, 0
    while k < len(ids) and pos < len(left):
        pos += len(pieces[k])  # type: ignore[arg-type]
        k += 1
    return ids[k:] if pos == len(left) else None


def _after_anchor(vocab: TokenText, partial: bytes, data: bytes) -> list[int] | None:
    """`data` encoded after a neutral newline, after single-byte tokens for the bytes of it that
    finish the committed half character `partial`."""
    head: list[int] = []
    if partial:
        finish = next((n for n in range(1, 4) if _is_utf8(partial + data[:n])), None)
        if finish is None or any(b not in vocab.byte_token for b in data[:finish]):
            return None
        head = [vocab.byte_token[b] for b in data[:finish]]
        data = data[finish:]
    text = complete_prefix(data)
    if not text:
        return head
    whole = ANCHOR + text.encode()
    rest = _after(vocab, ANCHOR, whole, vocab.encode(whole.decode()))
    return None if rest is None else head + rest


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False


def _decoder_kinds(state: Mapping) -> set[str]:
    kinds = {state.get("type", "")}
    for inner in state.get("decoders", []) or []:
        kinds |= _decoder_kinds(inner)
    return kinds


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet read backwards: symbol -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    symbols, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            symbols.append(256 + extra)
            extra += 1
    return {chr(s): b for b, s in zip(printable, symbols)}


# ---- the draft's view of the target's sequence ------------------------------------------------


class Mirror:
    """`dest` tokens of a growing `source` sequence, the same text (specials mapped by
    `map_specials`), re-encoded from the last safe boundary before the first changed token only.

    Invariant, whatever the updates: `ids` equals a fresh `Mirror(source, dest).update(sequence)`,
    which is each text run between special tokens encoded by `dest` in chunks cut at safe
    boundaries (by the look-behind rule, the same tokens as the run encoded whole), with `dest`'s
    BOS first when it adds one and the sequence does not open with a special that maps to it.
    `pending` holds the bytes of a character the sequence has only half written (a byte token of a
    multi-byte character): they are not in `ids` until it is finished.
    """

    def __init__(self, source: TokenText, dest: TokenText) -> None:
        self.source, self.dest = source, dest
        self.specials = map_specials(source, dest)
        self.reset()

    def reset(self) -> None:
        self.sequence: list[int] = []
        self.ids: list[int] = []
        self.pending = b""
        self._chunks: list[tuple[int, int]] = []  # (source start, dest start) of each chunk, in order

    def update(self, sequence: Sequence[int]) -> list[int]:
        """Bring `ids` to `sequence` (source ids) and return them."""
        sequence = list(sequence)
        same = 0
        limit = min(len(sequence), len(self.sequence))
        while same < limit and sequence[same] == self.sequence[same]:
            same += 1
        # a chunk start stays valid while the tokens on both sides of it are unchanged
        j = len(self._chunks) - 1
        while j > 0 and self._chunks[j][0] >= same:
            j -= 1
        if j <= 0:
            start, ids = 0, self._opening(sequence)
            self._chunks = []
        else:
            start, at = self._chunks[j]
            ids = self.ids[:at]
            del self._chunks[j:]
        self.pending = b""
        pieces = [self.source.piece(t) for t in sequence[start:]]
        chunks = list(_chunks(pieces))
        for n, (lo, hi) in enumerate(chunks):
            self._chunks.append((start + lo, len(ids)))
            if pieces[lo] is None:
                ids += self.specials.get(sequence[start + lo], [])
                continue
            data = b"".join(pieces[lo:hi])  # type: ignore[arg-type]
            if n == len(chunks) - 1 and hi == len(pieces):
                text, self.pending = _split_incomplete(data)
            else:
                text = data.decode("utf-8", errors="replace")
            if text:
                ids += self.dest.encode(text)
        self.sequence, self.ids = sequence, ids
        return ids

    def _opening(self, sequence: list[int]) -> list[int]:
        bos = self.dest.bos
        if bos is None or (sequence and self.specials.get(sequence[0]) == [bos]):
            return []
        return [bos]


def _chunks(pieces: Sequence[bytes | None]) -> Iterator[tuple[int, int]]:
    """(lo, hi) ranges of `pieces` (tokens as bytes, None for specials): each special alone, text
    cut at safe boundaries."""
    lo, before = 0, None  # before: the last byte of the chunk so far
    for i in range(len(pieces)):
        piece = pieces[i]
        if piece is None:
            if i > lo:
                yield lo, i
            yield i, i + 1
            lo, before = i + 1, None
            continue
        if i > lo and piece[:1] == b" " and before is not None and before not in WHITESPACE:
            yield lo, i
            lo = i
        if piece:
            before = piece[-1]
    if lo < len(pieces):
        yield lo, len(pieces)


def _split_incomplete(data: bytes) -> tuple[str, bytes]:
    """(text, the bytes of an unfinished last character): invalid bytes before it become U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    return text, decoder.getstate()[0]
