"""Marian's SentencePiece models → `tokenizers` files the server reads (no sentencepiece, transformers or torch
there).

Source side: the same Unigram segmentation as `source.spm` (its pieces and scores, its normalizer), with the
project's special tokens first (ids 0-3: pad, unk, bos, eos; serving/text/tokenizer.py), so the front model pads
and ends a source as it does for our own models. The model's ids differ: `vocab.json` numbers the pieces, and a
piece it lacks is the model's unknown token (MarianTokenizer's rule). That mapping, tokenizer id → model id, is a
table the encoder graph applies first (export/import_hf/marian.py).

Target side: decoding only. The model's ids → `vocab.json`'s pieces → text, as SentencePiece joins pieces (▁ is a
space, none before the first word); the model's special tokens are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from serving.text.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

SPACE = "▁"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece's piece types


def read_model(path: Path):
    """The SentencePiece ModelProto of a .spm file."""
    # transformers' copy of the proto's classes: sentencepiece's own needs a newer protobuf than tritonclient's
    from transformers.utils import sentencepiece_model_pb2_new as sentencepiece_model

    proto = sentencepiece_model.ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    return proto


def source_tokenizer(
    spm: Path, vocab: dict[str, int], unk: str, eos: str, pad: str
) -> tuple[Tokenizer, dict[str, int], list[int]]:
    """The source tokenizer, its unknown pieces (surface → tokenizer id, see `unknown_pieces`) and the table of
    model ids per tokenizer id (see the module docstring)."""
    proto = read_model(spm)
    if proto.trainer_spec.model_type != 1:
        raise ValueError(f"{spm}: only Unigram SentencePiece models are supported (model_type 1)")
    if proto.trainer_spec.byte_fallback or any(p.type in (USER_DEFINED, BYTE) for p in proto.pieces):
        raise ValueError(f"{spm}: byte fallback and user-defined symbols are not supported")
    pieces = [(p.piece, p.score) for p in proto.pieces if p.type == NORMAL]
    specials = {PAD: vocab[pad], UNK: vocab[unk], BOS: vocab[unk], EOS: vocab[eos]}  # bos is never fed to Marian
    table = [specials[token] for token in SPECIAL_TOKENS] + [vocab.get(piece, vocab[unk]) for piece, _ in pieces]
    unknown = unknown_pieces(pieces, vocab, first_id=len(table))
    table += [vocab[piece] for piece in unknown]
    unigram = models.Unigram([(token, 0.0) for token in SPECIAL_TOKENS] + pieces, SPECIAL_TOKENS.index(UNK), False)
    tokenizer = Tokenizer(unigram)
    steps = [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), SPACE)]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    tokenizer.normalizer = normalizers.Sequence(([normalizers.Precompiled(charsmap)] if charsmap else []) + steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    return tokenizer, unknown, table


def unknown_pieces(pieces: list[tuple[str, float]], vocab: dict[str, int], first_id: int) -> dict[str, int]:
    """SentencePiece gives a run of characters it does not know as one piece, its surface string, which
    MarianTokenizer then looks up in vocab.json (a target-side piece, often). `tokenizers` gives that run as one
    unknown token, so the vocabulary's pieces made only of such characters get tokenizer ids of their own from
    `first_id` on, which the front model puts in place of an unknown token whose text is one of them."""
    known = {ch for piece, _ in pieces for ch in piece}
    own = {piece for piece, _ in pieces}
    runs = [piece for piece in vocab if piece not in own and piece and not known.intersection(piece)]
    return {piece: first_id + i for i, piece in enumerate(runs)}


def target_tokenizer(vocab: dict[str, int], specials: list[str]) -> Tokenizer:
    """Model ids → text, with `specials` (eos, pad, unk) skipped as MarianTokenizer's skip_special_tokens does."""
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=specials[-1]))
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    return tokenizer


def read_vocab(folder: Path) -> dict[str, int]:
    return json.loads((Path(folder) / "vocab.json").read_text(encoding="utf-8"))
