"""`--task translate`: a Hugging Face MarianMTModel folder → a checkpoint folder the engine serves, and its task.

Writes ``<checkpoints>/<name>/``: encoder.onnx and decoder.onnx (the generation contract, with --int8 their
int8 twins), tokenizer.json and target_tokenizer.json (`tokenizers` files), config.json (the decoding rules of the
folder's generation config) and README.md (where it came from); and ``<tasks>/<name>.toml``, whose endpoint
`<name>` and streaming twin `<name>_stream` run the continuous-batching engine as `translate` does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx
import torch

from export.import_hf import marian, task_file
from export.import_hf.sentencepiece_json import read_vocab, source_tokenizer, target_tokenizer
from serving.text.tokenizer import UNKNOWN_PIECES_SUFFIX
from tasks import generation_contract as contract

ASSETS = ("tokenizer.json", "tokenizer" + UNKNOWN_PIECES_SUFFIX, "target_tokenizer.json", "config.json")

Progress = Callable[[str], None]


def import_translator(
    source: Path, name: str, checkpoints: Path, tasks_dir: Path, int8: bool = False, say: Progress = print
) -> list[Path]:
    """Import the MarianMTModel folder `source` as task `name`; returns the files written. Everything is
    checked before the first file is written: an unsupported folder raises ValueError and leaves nothing."""
    source = Path(source)
    for file in ("config.json", "source.spm", "target.spm", "vocab.json"):
        if not (source / file).is_file():
            raise ValueError(f"{source} has no {file}: a MarianMTModel folder (save_pretrained) holds it")
    say(f"reading {source}")
    model, settings = marian.load(source)
    tokenizer_config = read_tokenizer_config(source)
    if tokenizer_config.get("separate_vocabs"):
        raise marian.UnsupportedCheckpoint("tokenizer_config.separate_vocabs = True is not supported")
    vocab = read_vocab(source)
    names = {key: tokenizer_config.get(f"{key}_token", default) for key, default in _SPECIALS.items()}
    missing = [token for token in names.values() if token not in vocab]
    if missing:
        raise ValueError(f"{source}/vocab.json lacks the special tokens {missing}")
    src_tokenizer, unknown, table = source_tokenizer(
        source / "source.spm", vocab, names["unk"], names["eos"], names["pad"]
    )
    tgt_tokenizer = target_tokenizer(vocab, [names["eos"], names["pad"], names["unk"]])

    folder = Path(checkpoints) / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    written = []
    with torch.no_grad():
        say("exporting the encoder graph (fused attention)")
        ids = torch.tensor(table, dtype=torch.long)
        graphs = [marian.export_encoder(model, ids, settings)]
        say("exporting the decoder step graph (fused attention, cache written in place)")
        graphs.append(marian.export_decoder(model, settings))
    for proto, file in zip(graphs, contract.graph_files("fp32")):
        onnx.save(proto, str(folder / file))
        onnx.checker.check_model(str(folder / file))
        written.append(folder / file)
    if int8:
        say("quantizing both graphs to int8 (dynamic, MatMul weights)")
        written += quantize(folder)
    problems = contract.check_graphs(folder)
    if problems:
        raise RuntimeError("the exported graphs break the generation contract: " + "; ".join(problems))
    src_tokenizer.save(str(folder / "tokenizer.json"))
    unknown_file = (folder / "tokenizer.json").with_suffix(UNKNOWN_PIECES_SUFFIX)
    unknown_file.write_text(json.dumps(unknown, ensure_ascii=False) + "\n", encoding="utf-8")
    tgt_tokenizer.save(str(folder / "target_tokenizer.json"))
    max_tokens = min(settings.max_positions, int(tokenizer_config.get("model_max_length", settings.max_positions)))
    config = {
        "task": "translate",
        "architecture": "MarianMTModel",
        "imported_from": str(source.resolve()),
        "max_tokens": max_tokens,
        "generation": {
            "decoder_start_id": settings.decoder_start_id,
            "eos_id": settings.eos_id,
            "length_penalty": settings.length_penalty,
            "no_repeat_ngram_size": settings.no_repeat_ngram_size,
            "early_stopping": settings.early_stopping,
            "forced_eos": settings.forced_eos,
        },
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(_model_card(source, name, settings, int8), encoding="utf-8")
    written += [folder / f for f in (*ASSETS, "README.md")]
    definition = Path(tasks_dir) / f"{name}.toml"
    definition.parent.mkdir(parents=True, exist_ok=True)
    definition.write_text(task_definition(source, name, settings, int8), encoding="utf-8")
    written.append(definition)
    return written


_SPECIALS = {"unk": "<unk>", "eos": "</s>", "pad": "<pad>"}


def quantize(folder: Path, files: tuple[str, ...] = contract.graph_files("fp32")) -> list[Path]:
    """The graphs' int8 twins. The output projection shares its weight with the embedding, so it is a MatMul of a
    transposed weight, which the quantizer passes over; ONNX Runtime's constant folding first makes that weight a
    constant of its own, which is then quantized (the embedding's table stays float)."""
    import onnxruntime as ort

    from export.graphs.step_export import quantize_graph
    from serving.providers import inference_session

    written = []
    for file in files:
        folded = folder / f"folded.{file}"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        inference_session(folder / file, options)
        destination = folder / contract.INT8_FILES[file]
        quantize_graph(folded, destination)
        folded.unlink()
        written.append(destination)
    return written


def read_tokenizer_config(source: Path) -> dict:
    """The folder's tokenizer_config.json ({} when it has none)."""
    path = source / "tokenizer_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def task_definition(source: Path, name: str, settings: marian.MarianSettings, int8: bool) -> str:
    """The task's definition (tasks/definition.py): the options take the folder's generation config as defaults."""
    endpoint = task_file.engine_endpoint("serving.frontends.engine_front:EngineFront", int8)
    most = settings.max_positions - 1
    options = task_file.generation_options(
        settings.max_new_tokens, most, settings.num_beams, True, "the decoder's position table"
    )
    return f'''# Imported from the Hugging Face MarianMTModel folder {source.resolve()}
# by `python -m export.import_hf {source} --task translate --name {name}{" --int8" if int8 else ""}`.
# The defaults below are its generation config's; edit them here, then `make repository`.
summary = "translate with {name} (MarianMTModel imported from Hugging Face); prints one translation per line"
example = 'python -m clients {name} "我爱你。"'
checkpoint = "{name}"
assets = {json.dumps(list(ASSETS))}
{options}
[endpoint]
{endpoint}
outputs = [{{ name = "TRANSLATION", type = "string" }}]

[stream]
{endpoint}

[loadtest]
weight = 1
{task_file.TRANSLATION_LOADTEST}
texts = ["我爱你。", "他休息两天。", "今天天气很好。", "你叫什么名字？"]
'''


def _model_card(source: Path, name: str, settings: marian.MarianSettings, int8: bool) -> str:
    return f"""# {name}: MarianMTModel imported from Hugging Face

Imported from `{source.resolve()}` by `python -m export.import_hf {source} --task translate --name {name}\
{" --int8" if int8 else ""}`. The weights, vocabulary and licence are that folder's: read its model card for what
it was trained on and the terms of its use.

- {settings.encoder_layers} encoder and {settings.decoder_layers} decoder layers, d_model {settings.d_model}, \
{settings.decoder_heads} heads, vocabulary {settings.vocab_size:,}
- decoding as its generation config: {settings.num_beams} beams, length penalty {settings.length_penalty}, \
at most {settings.max_new_tokens} new tokens, early stopping {settings.early_stopping}, forced eos \
{settings.forced_eos}, never generated: {list(settings.banned)}
- graphs: encoder.onnx, decoder.onnx (tasks/generation_contract.py){", and their int8 twins" if int8 else ""}
"""
