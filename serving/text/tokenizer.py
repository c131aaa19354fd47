"""Tokenizers trained with Hugging Face `tokenizers` on the training text.

Chinese is split into single characters (BERT's CJK handling), everything else into WordPiece
sub-words. Characters are the natural unit for Chinese: no word segmenter is needed, the vocab
stays small, and attention maps read one character per row (as in the seed's 我/爱/你 example).
Control characters and NUL bytes are removed by the normalizer, so text that consists only of
them becomes empty, which the serving layer reports as an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS]  # ids 0..3, the same in every tokenizer of the project
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)
UNKNOWN_PIECES_SUFFIX = ".unknown_pieces.json"  # beside a tokenizer file: serving/frontends/base.py, BatchTokenizer


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2, lowercase: bool = True, cjk_chars: bool = True
) -> Tokenizer:
    """WordPiece over BERT-normalized text (controls removed).

    cjk_chars=True isolates every Chinese character (one token each); False lets WordPiece learn
    multi-character pieces inside runs of Chinese text (words such as 不错, 好吃), which gives a
    classifier shorter sequences and word-level features. Inputs are lower-cased (fewer rare
    tokens); an English target keeps its case so that translations come out properly cased.
    """
    tok = Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=200))
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=cjk_chars, strip_accents=False, lowercase=lowercase
            ),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def train_or_resume(path: Path | None, train: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer saved at `path` if there is one, else a newly trained one saved there.

    WordPiece training is not deterministic in its id order, so a resumed training run must reuse
    the tokenizer its weights were trained with; it is kept beside the resumable state file.
    """
    if path is not None and Path(path).exists():
        return load_tokenizer(str(path))
    tokenizer = train()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(path))
    return tokenizer


_APOSTROPHE = re.compile(r"(\w) ' (\w)")  # "Don ' t" → "Don't"
_OPEN_APOSTROPHE = re.compile(r"\w '$")  # what _APOSTROPHE may still join once a word follows


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return 0x3000 <= cp <= 0x9FFF or 0xF900 <= cp <= 0xFAFF or 0xFF00 <= cp <= 0xFFEF or 0x20000 <= cp <= 0x2FA1F


def detokenize(tokenizer: Tokenizer, ids: list[int]) -> str:
    """Token ids → text. The WordPiece decoder joins tokens with spaces; Chinese has none, so
    spaces touching a CJK character or full-width punctuation are removed. A SentencePiece tokenizer (an
    imported model's) keeps its spaces in the pieces: its text is the decoder's as it is."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if not isinstance(tokenizer.decoder, decoders.WordPiece):
        return text
    out = []
    for i, ch in enumerate(text):
        if ch == " " and 0 < i < len(text) - 1 and (is_cjk(text[i - 1]) or is_cjk(text[i + 1])):
            continue
        out.append(ch)
    return _APOSTROPHE.sub(r"\1'\2", "".join(out))


def settled_prefix(text: str) -> str:
    """The part of `detokenize(tokens)` that more tokens cannot change: what a stream may send of a partial
    answer. The WordPiece decoder renders each token on its own (a space first unless it is a "##" piece; its
    cleanup attaches "." "," "?" "!" to the token itself), and a space that goes next to a Chinese character is
    the new token's own, so more tokens only append. The exception is an apostrophe after a word, which
    `_APOSTROPHE` joins to the next word ("Don '" → "Don't"): it is held back. A byte-level tokenizer's (a chat
    model's) partial answer may end inside a character, which decodes as U+FFFD until its last byte comes: held
    back too."""
    text = text.rstrip("\ufffd")
    return text[:-2] if _OPEN_APOSTROPHE.search(text) else text


def strip_generated(tokens, bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> list[int]:
    """One generated row (bos, tokens, eos/pad filling) → the tokens: drop a leading bos, stop at eos or pad."""
    tokens = [int(t) for t in tokens]
    if tokens and tokens[0] == bos_id:
        tokens = tokens[1:]
    out = []
    for token in tokens:
        if token in (eos_id, pad_id):
            break
        out.append(token)
    return out
