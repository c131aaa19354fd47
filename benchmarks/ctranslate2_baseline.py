"""CTranslate2 as a baseline for the translate checkpoint: our weights in its `TransformerSpec`, decoded by its
`Translator`, compared token by token with our ONNX generator and timed offline.

CTranslate2 is what users pick for CPU translation, so it is the peer the served BeamSearch generator is compared
with. Nothing is retrained or approximated: `convert` maps every weight of checkpoints/translate onto the spec,

- pre-norm blocks with a final LayerNorm in encoder and decoder, LayerNorm epsilon 1e-5 (PyTorch's default);
- token embeddings times sqrt(d_model) in both stacks, no position embeddings: RoPE rotates Q and K of every
  self-attention (encoder and decoder; cross-attention has none) over the whole head (``rotary_dim=0``) in the
  half-split layout (``rotary_interleave=False``), base ``rope_base``;
- the fused QKV projection as is (CTranslate2 splits [q; k; v] along the output rows, as ``chunk(3)`` does), the
  fused cross-attention K/V projection as is ([k; v]);
- the exact (erf) GELU of ``F.gelu``, not the tanh approximation;
- separate source and target vocabularies, token strings in id order from our two tokenizers, so CTranslate2's
  ids are ours; [BOS] starts the decoder, [EOS] ends it;
- the output projection tied to the target embedding, without bias (CTranslate2 stores it once, as an alias).

Sources are tokenized as the front model does (ids[:max_tokens-1] + [EOS], an empty text read as [UNK]); the
decoding settings are the served ones: the checkpoint's length penalty and n-gram blocking, and the task's
max_new_tokens default.

Greedy decoding is then the same computation (float32: every Tatoeba test sentence gives the same tokens). Beam
search is not quite: ORT's BeamSearch (early_stopping) closes a source as soon as it holds num_beams finished
hypotheses and divides log p by (tokens + 1) ** length_penalty (bos counted), while CTranslate2 searches on and
divides by tokens ** length_penalty. The few beam-4 outputs that differ score higher in CTranslate2 under either
normalization, so its longer search, not the formula, makes them differ.

    python -m benchmarks.ctranslate2_baseline                # convert fp32 + int8, agreement, a short timing
    python -m benchmarks.ctranslate2_baseline --no-timing    # agreement only
    python -m benchmarks.ctranslate2_baseline --no-agreement --repeats 5 --threads 1 2

`ctranslate2` is not a dependency of the package; install it beside the `bench` extra.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from serving.text.tokenizer import BOS, EOS, EOS_ID, UNK, detokenize, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "translate"
GENERATOR = ROOT / "model_repository" / "translate_generator" / "1" / "model.onnx"
TEST_FILE = Path("translation") / "tatoeba_test_zh_en.tsv"  # under the data directory: zh<TAB>en, header first
LAYER_NORM_EPSILON = 1e-5  # nn.LayerNorm's default, which every LayerNorm of the model uses
BATCH_SIZE = 32
# Files copied beside the CTranslate2 model: our tokenizers, and the checkpoint's config.json under another name
# (CTranslate2 writes its own config.json).
SOURCE_TOKENIZER, TARGET_TOKENIZER, CHECKPOINT_CONFIG = "tokenizer.json", "target_tokenizer.json", "checkpoint.json"


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError as err:  # not a dependency of the package
        raise ImportError("ctranslate2 is not installed: pip install ctranslate2 (see the bench extra)") from err
    return ctranslate2


# ---------------------------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------------------------


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's token strings in id order: CTranslate2 maps strings to ids by position in this list."""
    size = tokenizer.get_vocab_size()
    tokens = [tokenizer.id_to_token(i) for i in range(size)]
    if None in tokens or len(set(tokens)) != size:
        raise ValueError("the tokenizer's ids are not a dense range of distinct tokens")
    return tokens


def build_spec(model: Any, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer) -> Any:
    """Our `Seq2Seq` (export/model/transformer.py) as a `ctranslate2.specs.TransformerSpec`, weights set, not yet
    saved."""
    _ctranslate2()  # a clear message when it is missing
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    if cfg.positional != "rope" or cfg.copy:
        raise ValueError("only the RoPE encoder-decoder without the copy pointer has a CTranslate2 equivalent")
    weights = {name: tensor.detach().float().cpu().numpy() for name, tensor in model.state_dict().items()}
    shape = dict(
        pre_norm=True,
        activation=common_spec.Activation.GELU,  # F.gelu's default is the exact erf form
        rotary_dim=0,  # 0 = every dimension of the head
        rotary_interleave=False,  # rotate the halves (x1, x2), as export/model/positional.py apply_rope does
        rotary_base=cfg.rope_base,
    )
    encoder = transformer_spec.TransformerEncoderSpec(cfg.n_layers, cfg.n_heads, **shape)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, **shape)
    # Both specs scale the embeddings by sqrt(d_model) by default (scale_embeddings = True), as our model does. The
    # decoder spec has no position encodings once rotary_dim is set; the encoder spec still declares an optional
    # table, which CTranslate2 ignores when the self-attention is rotary, and which stays unset here.
    assert encoder.scale_embeddings and decoder.scale_embeddings

    def linear(spec: Any, prefix: str) -> None:
        spec.weight = weights[f"{prefix}.weight"]
        spec.bias = weights[f"{prefix}.bias"]

    def norm(spec: Any, prefix: str) -> None:
        spec.gamma = weights[f"{prefix}.weight"]
        spec.beta = weights[f"{prefix}.bias"]

    def ffn(spec: Any, prefix: str) -> None:
        norm(spec.layer_norm, f"{prefix}.ffn_norm")
        linear(spec.linear_0, f"{prefix}.ffn.up")
        linear(spec.linear_1, f"{prefix}.ffn.down")

    def self_attention(spec: Any, prefix: str) -> None:
        norm(spec.layer_norm, f"{prefix}.attn_norm")
        linear(spec.linear[0], f"{prefix}.attn.qkv")  # fused [q; k; v]
        linear(spec.linear[1], f"{prefix}.attn.out")

    encoder.embeddings[0].weight = weights["encoder.embed.weight"]
    for i, layer in enumerate(encoder.layer):
        self_attention(layer.self_attention, f"encoder.blocks.{i}")
        ffn(layer.ffn, f"encoder.blocks.{i}")
    norm(encoder.layer_norm, "encoder.norm")

    decoder.embeddings.weight = weights["decoder.embed.weight"]
    for i, layer in enumerate(decoder.layer):
        prefix = f"decoder.blocks.{i}"
        self_attention(layer.self_attention, prefix)
        norm(layer.attention.layer_norm, f"{prefix}.cross_norm")
        linear(layer.attention.linear[0], f"{prefix}.cross_attn.q")
        linear(layer.attention.linear[1], f"{prefix}.cross_attn.kv")  # fused [k; v]
        linear(layer.attention.linear[2], f"{prefix}.cross_attn.out")
        ffn(layer.ffn, prefix)
    norm(decoder.layer_norm, "decoder.norm")
    decoder.projection.weight = weights["decoder.embed.weight"]  # tied, no bias: logits = LN(h) · Eᵀ

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.config.unk_token = UNK
    spec.config.bos_token = BOS
    spec.config.eos_token = EOS
    spec.config.decoder_start_token = BOS
    spec.register_source_vocabulary(vocabulary(src_tokenizer))
    spec.register_target_vocabulary(vocabulary(tgt_tokenizer))
    for token, token_id in ((UNK, 1), (BOS, cfg.bos_id), (EOS, cfg.eos_id)):
        if tgt_tokenizer.token_to_id(token) != token_id:
            raise ValueError(f"target token {token} is not id {token_id}")
    return spec


def convert(checkpoint_dir: Path, out_dir: Path, quantization: str | None = None) -> Path:
    """Write the CTranslate2 model of a translate checkpoint to out_dir (replaced if it holds one); returns it.

    quantization: None keeps float32; "int8" (and CTranslate2's other weight types) quantizes the weights, the
    embeddings and the tied projection included. Our tokenizers and the checkpoint's config travel with it.
    """
    from export.training import seq2seq

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    model, _, src_tokenizer, tgt_tokenizer = seq2seq.load(checkpoint_dir)
    spec = build_spec(model, src_tokenizer, tgt_tokenizer)
    spec.register_file(str(checkpoint_dir / seq2seq.SOURCE_TOKENIZER), SOURCE_TOKENIZER)
    spec.register_file(str(checkpoint_dir / seq2seq.TARGET_TOKENIZER), TARGET_TOKENIZER)
    spec.register_file(str(checkpoint_dir / "config.json"), CHECKPOINT_CONFIG)
    spec.validate()
    spec.optimize(quantization=quantization)
    if out_dir.exists():
        if not (out_dir / "model.bin").exists() and any(out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} is not empty and holds no CTranslate2 model; not replacing it")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    spec.save(str(out_dir))
    return out_dir


# ---------------------------------------------------------------------------------------------------------------
# Translation
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Baseline:
    """A loaded CTranslate2 model with what decoding needs from the checkpoint."""

    translator: Any
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    max_tokens: int  # source tokens, eos included (config.json max_tokens)
    length_penalty: float
    no_repeat_ngram_size: int

    @classmethod
    def load(cls, model_dir: Path, threads: int) -> Baseline:
        """intra_threads = threads and one worker (inter_threads=1): one batch at a time, as the timing needs."""
        ctranslate2 = _ctranslate2()
        model_dir = Path(model_dir)
        config = json.loads((model_dir / CHECKPOINT_CONFIG).read_text(encoding="utf-8"))
        translator = ctranslate2.Translator(
            str(model_dir), device="cpu", compute_type="default", inter_threads=1, intra_threads=threads
        )
        return cls(
            translator,
            load_tokenizer(model_dir / SOURCE_TOKENIZER),
            load_tokenizer(model_dir / TARGET_TOKENIZER),
            int(config["max_tokens"]),
            float(config.get("length_penalty", 1.0)),
            int(config.get("no_repeat_ngram_size", 0)),
        )

    def source_tokens(self, sentences: Sequence[str]) -> list[list[str]]:
        """The front model's source ids (serving/frontends/base.py BatchTokenizer) as token strings."""
        encodings = self.src_tokenizer.encode_batch(list(sentences), add_special_tokens=False)
        ids = [
            (enc.ids[: self.max_tokens - 1] or [self.src_tokenizer.token_to_id(UNK)]) + [EOS_ID] for enc in encodings
        ]
        return [[self.src_tokenizer.id_to_token(i) for i in row] for row in ids]

    def generate(
        self, sources: Sequence[list[str]], beam_size: int, max_decoding_length: int, batch_size: int = BATCH_SIZE
    ) -> list[list[int]]:
        """Target ids (no bos/eos) per source, one `translate_batch` call per batch_size sources in order."""
        out: list[list[int]] = []
        for start in range(0, len(sources), batch_size):
            out += self.translate_batch(sources[start : start + batch_size], beam_size, max_decoding_length)
        return out

    def translate_batch(self, batch: Sequence[list[str]], beam_size: int, max_decoding_length: int) -> list[list[int]]:
        results = self.translator.translate_batch(
            list(batch),
            beam_size=beam_size,
            length_penalty=self.length_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            max_decoding_length=max_decoding_length,
            num_hypotheses=1,
        )
        to_id = self.tgt_tokenizer.token_to_id
        return [[to_id(token) for token in result.hypotheses[0]] for result in results]


def translate(
    model_dir: Path,
    sentences: Sequence[str],
    beam_size: int,
    max_decoding_length: int,
    threads: int,
    batch_size: int = BATCH_SIZE,
) -> list[str]:
    """Translations of the sentences by the CTranslate2 model in model_dir (as `convert` wrote it)."""
    baseline = Baseline.load(model_dir, threads)
    ids = baseline.generate(baseline.source_tokens(sentences), beam_size, max_decoding_length, batch_size)
    return [detokenize(baseline.tgt_tokenizer, row) for row in ids]


def served_max_new_tokens() -> int:
    """The translate endpoint's default max_new_tokens (tasks/translate.toml): 48."""
    from tasks.definition import get as get_task

    return int(get_task("translate").option("max_new_tokens").default)


# ---------------------------------------------------------------------------------------------------------------
# The reference: our ONNX generator
# ---------------------------------------------------------------------------------------------------------------


def onnx_generator(path: Path | None = None, threads: int | None = None, scratch: Path | None = None) -> Any:
    """An ORT session of the served generator: `path`, else model_repository's, else one exported the way
    export.build_repository exports it into `scratch` (a temporary folder when not given)."""
    from benchmarks.onnx_variants import session

    path = Path(path) if path else GENERATOR
    if not path.exists():
        from export.build_repository import seq2seq_generator
        from tasks.definition import get as get_task

        folder = Path(scratch) if scratch else Path(tempfile.mkdtemp(prefix="translate_generator_"))
        path = seq2seq_generator(get_task("translate"), CHECKPOINT, folder / "model.onnx")
    return session(path, threads)


def onnx_generate(
    session: Any,
    src_tokenizer: Tokenizer,
    max_tokens: int,
    sentences: Sequence[str],
    beam_size: int,
    max_new_tokens: int,
    batch_size: int = BATCH_SIZE,
) -> list[list[int]]:
    """Our generator's target ids per sentence: the front model's tokenizer and padding, batch_size at a time."""
    from export.graphs.seq2seq_export import generate_onnx
    from serving.frontends.base import BatchTokenizer

    tokenizer = BatchTokenizer(src_tokenizer, max_tokens)
    out: list[list[int]] = []
    for start in range(0, len(sentences), batch_size):
        batch = tokenizer.encode(sentences[start : start + batch_size], suffix=[EOS_ID])
        out += generate_onnx(session, batch.ids, batch.mask, max_new_tokens, beam_size)
    return out


def agreement(ours: Sequence[list[int]], theirs: Sequence[list[int]]) -> dict[str, Any]:
    """How many outputs are token-for-token equal, and the indices of the others."""
    differing = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    return {"equal": len(ours) - len(differing), "total": len(ours), "differing": differing}


# ---------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------


def median_throughput(run_batch: Callable[[Any], list[list[int]]], batches: Sequence[Any], repeats: int) -> dict:
    """One warm-up pass over the batches, then `repeats` timed passes; the median pass as sentences/s and
    generated tokens/s (eos and padding not counted)."""

    def one_pass() -> tuple[float, int, int]:
        tokens = sentences = 0
        start = time.perf_counter()
        for batch in batches:
            outputs = run_batch(batch)
            sentences += len(outputs)
            tokens += sum(len(row) for row in outputs)
        return time.perf_counter() - start, tokens, sentences

    one_pass()  # warm-up: allocators, caches, thread pools
    passes = [one_pass() for _ in range(repeats)]
    seconds = statistics.median(s for s, _, _ in passes)
    _, tokens, sentences = passes[0]
    return {
        "sentences": sentences,
        "tokens": tokens,
        "repeats": repeats,
        "seconds_median": round(seconds, 3),
        "seconds_all": [round(s, 3) for s, _, _ in passes],
        "sentences_per_s": round(sentences / seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1),
    }


def time_translate_batch(
    model_dir: Path,
    sentences: Sequence[str],
    threads: int,
    beam_size: int = 1,
    max_decoding_length: int | None = None,
    repeats: int = 3,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """Offline CTranslate2 `translate_batch` throughput at `threads` intra-op threads: sentences in file order,
    batch_size per call, tokenized beforehand (only the calls are timed), median of `repeats` passes."""
    baseline = Baseline.load(model_dir, threads)
    max_decoding_length = max_decoding_length or served_max_new_tokens()
    sources = baseline.source_tokens(sentences)
    batches = [sources[i : i + batch_size] for i in range(0, len(sources), batch_size)]
    rates = median_throughput(
        lambda batch: baseline.translate_batch(batch, beam_size, max_decoding_length), batches, repeats
    )
    return {"threads": threads, "beam_size": beam_size, "batch_size": batch_size, **rates}


def time_onnx_generator(
    sentences: Sequence[str],
    threads: int,
    beam_size: int = 1,
    max_new_tokens: int | None = None,
    repeats: int = 3,
    batch_size: int = BATCH_SIZE,
    generator: Path | None = None,
) -> dict[str, Any]:
    """Our ONNX generator under the same protocol (the front model's tokenization and padding done beforehand)."""
    from export.graphs.seq2seq_export import generate_onnx
    from serving.frontends.base import BatchTokenizer

    config = json.loads((CHECKPOINT / "config.json").read_text(encoding="utf-8"))
    tokenizer = BatchTokenizer(load_tokenizer(CHECKPOINT / SOURCE_TOKENIZER), int(config["max_tokens"]))
    session = onnx_generator(generator, threads)
    max_new_tokens = max_new_tokens or served_max_new_tokens()
    batches = [
        tokenizer.encode(sentences[i : i + batch_size], suffix=[EOS_ID]) for i in range(0, len(sentences), batch_size)
    ]
    rates = median_throughput(
        lambda batch: generate_onnx(session, batch.ids, batch.mask, max_new_tokens, beam_size), batches, repeats
    )
    return {"threads": threads, "beam_size": beam_size, "batch_size": batch_size, **rates}


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def read_test_sentences(data_dir: Path) -> list[str]:
    """The Chinese side of the Tatoeba test file, in file order (export.training.data.read_translation's test pairs)."""
    path = Path(data_dir) / TEST_FILE
    with open(path, encoding="utf-8") as f:
        next(f)  # header zh<TAB>en
        return [line.rstrip("\n").split("\t")[0].strip() for line in f if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    from export.training.data import DEFAULT_DATA_DIR
    from serving.ort_backend.session_config import available_cpus

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ctranslate2_baseline",
        description="Convert checkpoints/translate to CTranslate2 (fp32, int8), check its tokens against our ONNX "
        "generator on the Tatoeba test set (greedy, beam 4), and time offline translate_batch.",
    )
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--out", type=Path, default=None, help="where the converted models go (default: a temp dir)")
    parser.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="holds translation/tatoeba_test_zh_en.tsv"
    )
    parser.add_argument("--generator", type=Path, default=GENERATOR, help="our ONNX generator (the reference)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--quantization", nargs="+", default=["float32", "int8"], choices=["float32", "int8"])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4], help="beam sizes (1 = greedy)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the served default (48)")
    parser.add_argument("--threads", nargs="+", type=int, default=[available_cpus()], help="intra-op thread counts")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per setting (median reported)")
    parser.add_argument("--timing-sentences", type=int, default=None, help="time on the first N sentences only")
    parser.add_argument("--no-agreement", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-onnx-timing", action="store_true", help="time CTranslate2 only, not our generator")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    _ctranslate2()  # fail before any work when it is missing
    sentences = read_test_sentences(args.data_dir)[: args.limit]
    max_new = args.max_new_tokens or served_max_new_tokens()
    out_root = args.out or Path(tempfile.mkdtemp(prefix="ct2_translate_"))
    results: dict[str, Any] = {"sentences": len(sentences), "max_new_tokens": max_new, "agreement": {}, "timing": []}

    models = {}
    for quant in args.quantization:
        t0 = time.perf_counter()
        models[quant] = convert(args.checkpoint, out_root / quant, None if quant == "float32" else quant)
        size = (models[quant] / "model.bin").stat().st_size / 2**20
        print(f"converted {quant}: {models[quant]} ({size:.1f} MiB, {time.perf_counter() - t0:.1f} s)")

    if not args.no_agreement:
        session = onnx_generator(args.generator, available_cpus())
        config = json.loads((args.checkpoint / "config.json").read_text(encoding="utf-8"))
        src_tokenizer = load_tokenizer(args.checkpoint / SOURCE_TOKENIZER)
        for beams in args.beams:
            reference = onnx_generate(session, src_tokenizer, config["max_tokens"], sentences, beams, max_new)
            for quant, model_dir in models.items():
                baseline = Baseline.load(model_dir, available_cpus())
                ours = baseline.generate(baseline.source_tokens(sentences), beams, max_new)
                report = agreement(reference, ours)
                results["agreement"][f"{quant}_beam{beams}"] = report
                print(
                    f"agreement {quant} beam {beams}: {report['equal']}/{report['total']} equal to the ONNX generator"
                )
                for i in report["differing"][:3]:
                    tgt = baseline.tgt_tokenizer
                    print(f"  [{i}] {sentences[i]}\n      onnx: {detokenize(tgt, reference[i])}")
                    print(f"      ct2:  {detokenize(tgt, ours[i])}")

    if not args.no_timing:
        timed = sentences[: args.timing_sentences]
        if not args.no_onnx_timing:
            for beams in args.beams:
                for threads in args.threads:
                    row = {
                        "runtime": "onnx_generator",
                        **time_onnx_generator(timed, threads, beams, max_new, args.repeats, generator=args.generator),
                    }
                    results["timing"].append(row)
                    print(
                        f"timing onnx generator beam {beams} threads {threads}: {row['tokens_per_s']} tokens/s, "
                        f"{row['sentences_per_s']} sentences/s (median of {row['repeats']}: {row['seconds_all']} s)"
                    )
        for quant, model_dir in models.items():
            for beams in args.beams:
                for threads in args.threads:
                    row = {
                        "runtime": f"ctranslate2_{quant}",
                        **time_translate_batch(model_dir, timed, threads, beams, max_new, args.repeats),
                    }
                    results["timing"].append(row)
                    print(
                        f"timing ctranslate2 {quant} beam {beams} threads {threads}: {row['tokens_per_s']} tokens/s, "
                        f"{row['sentences_per_s']} sentences/s (median of {row['repeats']}: {row['seconds_all']} s)"
                    )

    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    if args.out is None:
        shutil.rmtree(out_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
