"""`--task translate|summarize` for a decoder-only chat model (Qwen2, Qwen3, Llama, Mistral): a Hugging Face folder
→ a checkpoint folder the engine serves, and its task.

Writes ``<checkpoints>/<name>/``: decoder.onnx (tasks/generation_contract.py, decoder-only: one step graph that
reads prompts in chunks and decodes; with --int8 its int8 twin), tokenizer.json (the folder's own, read with
`tokenizers`), chat_template.jinja, config.json (the decoding rules, the special tokens the template reads) and
README.md; and ``<tasks>/<name>.toml``, whose endpoint `<name>` and streaming twin `<name>_stream` run the
continuous-batching engine with the chat front (serving/frontends/chat_front.py). The prompt is the task file's
`[prompt]`: an instruction holding the text, and an optional system message, rendered with the checkpoint's chat
template on the server.

Everything goes into a staging folder first; a handful of prompts are decoded there by the engine and compared
with `model.generate`, and only then does the staging folder replace the old model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import torch

from export.import_hf import causal_lm, task_file
from export.import_hf.translation import read_tokenizer_config
from tasks import generation_contract as contract

INSTRUCTIONS = {  # the user's message per task, the text at {text}; edit it in the task file
    "translate": "Translate the following Chinese text into English. Reply with the translation only.\n\n{text}",
    "summarize": "用一句话概括下面这段文字，只回答概括本身。\n\n{text}",
}
OUTPUTS = {"translate": "TRANSLATION", "summarize": "SUMMARY"}
FRONTS = {"translate": "ChatTranslate", "summarize": "ChatSummarize"}
ASSETS = ("tokenizer.json", "chat_template.jinja", "config.json")
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
CHECKED_PROMPTS = ("我爱你。", "今天天气很好，我们去公园散步吧。", "他不喜欢喝咖啡。", "猫在桌子上睡觉。")
CHECKED_TOKENS = 12
EXTERNAL_DATA_BYTES = 1 << 30  # a graph whose weights pass this keeps them in a file beside it (protobuf: 2 GB)

Progress = Callable[[str], None]


def chat_template(source: Path) -> str:
    """The folder's chat template: chat_template.jinja (transformers 5), else tokenizer_config.json's."""
    path = source / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = read_tokenizer_config(source).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise ValueError(f"{source} has no chat template (chat_template.jinja or tokenizer_config.json)")
    return template


def special_tokens(source: Path) -> dict[str, str]:
    """The special tokens a template may name, from tokenizer_config.json (a string or an AddedToken dict)."""
    config = read_tokenizer_config(source)
    found = {}
    for key in SPECIAL_TOKENS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


def import_causal_lm(
    source: Path,
    name: str,
    task: str,
    checkpoints: Path,
    tasks_dir: Path,
    int8: bool = False,
    say: Progress = print,
) -> list[Path]:
    """Import the decoder-only folder `source` as task `name` (translate or summarize); returns the files
    written. An unsupported folder raises ValueError before anything is written."""
    from serving.text.chat import ChatPrompt, PromptError

    source = Path(source)
    for file in ("config.json", "tokenizer.json"):
        if not (source / file).is_file():
            raise ValueError(f"{source} has no {file}: a decoder-only folder (save_pretrained) holds it")
    template, specials = chat_template(source), special_tokens(source)
    try:
        ChatPrompt(template, INSTRUCTIONS[task], "", tuple(specials.items()))(CHECKED_PROMPTS[0])
    except PromptError as err:
        raise ValueError(str(err)) from None
    except Exception as err:  # a template that raises for a plain user message cannot serve
        raise ValueError(f"the chat template fails on a user message: {err}") from None
    say(f"reading {source}")
    model, settings = causal_lm.load(source)

    folder = Path(checkpoints) / name
    staging = Path(checkpoints) / f".{name}.staging"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        graphs = _write_graphs(model, settings, staging, int8, say)
        shutil.copy2(source / "tokenizer.json", staging / "tokenizer.json")
        (staging / "chat_template.jinja").write_text(template, encoding="utf-8")
        config = checkpoint_config(source, task, settings, specials)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (staging / "README.md").write_text(_model_card(source, name, task, settings, int8), encoding="utf-8")
        say(f"checking {len(CHECKED_PROMPTS)} prompts against transformers' generate")
        check_against_generate(model, staging, config, template, specials)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    definition = Path(tasks_dir) / f"{name}.toml"
    definition.parent.mkdir(parents=True, exist_ok=True)
    definition.write_text(task_definition(source, name, task, settings, int8), encoding="utf-8")
    written = [folder / path.relative_to(staging) for path in graphs]
    return [*written, *(folder / f for f in (*ASSETS, "README.md")), definition]


def _write_graphs(
    model: Any, settings: causal_lm.CausalSettings, folder: Path, int8: bool, say: Progress
) -> list[Path]:
    written = []
    external = sum(p.numel() * 4 for p in model.parameters()) > EXTERNAL_DATA_BYTES
    with torch.no_grad():
        say("exporting the step graph (fused rotary and grouped-query attention, its cache written in place)")
        step = causal_lm.export_step(model, settings)
    for proto, file in zip((step,), contract.graph_files("fp32", decoder_only=True)):
        path = folder / file
        if external:
            onnx.save(proto, str(path), save_as_external_data=True, location=f"{file}.data")
            written.append(folder / f"{file}.data")
        else:
            onnx.save(proto, str(path))
        onnx.checker.check_model(str(path))
        written.append(path)
    if int8:
        from export.import_hf.translation import quantize

        say("quantizing the step graph to int8 (dynamic, MatMul weights)")
        written += quantize(folder, contract.graph_files("fp32", decoder_only=True))
    problems = contract.check_graphs(folder)
    if problems:
        raise RuntimeError("the exported graphs break the generation contract: " + "; ".join(problems))
    return written


def checkpoint_config(
    source: Path, task: str, settings: causal_lm.CausalSettings, specials: dict[str, str]
) -> dict[str, Any]:
    """The checkpoint's config.json: what the front model and the engine read (serving/engine/config.py)."""
    return {
        "task": task,
        "architecture": causal_lm.ARCHITECTURES[settings.model_type],
        "decoder_only": True,
        "imported_from": str(source.resolve()),
        "context": settings.context,
        "special_tokens": specials,
        "generation": {
            "decoder_start_id": settings.eos_ids[0],  # unused: a decoder-only model continues its prompt
            "eos_id": settings.eos_ids[0],
            "other_eos_ids": list(settings.eos_ids[1:]),
            "length_penalty": settings.length_penalty,
            "no_repeat_ngram_size": settings.no_repeat_ngram_size,
            "early_stopping": settings.early_stopping,
            "forced_eos": False,
            "sampling": dict(settings.sampling),  # the chat twin's defaults
        },
    }


def check_against_generate(model: Any, folder: Path, config: dict, template: str, specials: dict[str, str]) -> None:
    """Greedy answers of the staged graphs, run by the engine, equal `model.generate`'s on a few prompts."""
    from tokenizers import Tokenizer

    from serving.engine.engine import Engine, Job
    from serving.text.chat import ChatPrompt

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = ChatPrompt(template, INSTRUCTIONS[config["task"]], "", tuple(specials.items()))
    prompts = [tokenizer.encode(prompt(text), add_special_tokens=False).ids for text in CHECKED_PROMPTS]
    engine = Engine.load(folder, threads=2)
    ours: list[list[int]] = [[] for _ in prompts]
    for row, ids in enumerate(prompts):
        engine.submit(Job(ids, CHECKED_TOKENS, 1, lambda new, final, row=row: ours[row].extend(new)))
    engine.run_until_idle()
    eos = {config["generation"]["eos_id"], *config["generation"]["other_eos_ids"]}
    with torch.no_grad():
        for ids, answer in zip(prompts, ours):
            out = model.generate(  # greedy as the task endpoints decode: the folder's sampling is the chat twin's
                torch.tensor([ids]), max_new_tokens=CHECKED_TOKENS, do_sample=False, num_beams=1,
                repetition_penalty=1.0, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0],
            )  # fmt: skip
            theirs = [t for t in out[0, len(ids) :].tolist() if t not in eos]
            if answer != theirs:
                raise RuntimeError(
                    f"the exported graphs do not decode as transformers does: {answer} against {theirs} "
                    "(nothing was replaced)"
                )


def task_definition(source: Path, name: str, task: str, settings: causal_lm.CausalSettings, int8: bool) -> str:
    """The task's definition (tasks/definition.py): the decoding defaults are the folder's generation config's,
    the prompt the task's default instruction."""
    flags = " --int8" if int8 else ""
    architecture = causal_lm.ARCHITECTURES[settings.model_type]
    endpoint = task_file.engine_endpoint(f"serving.frontends.chat_front:{FRONTS[task]}", int8)
    chat = task_file.engine_endpoint("serving.frontends.chat_front:ChatCompletions", int8)
    why = "a quarter of the served context: the prompt takes the rest"
    most = min(1024, settings.context // 4)
    options = task_file.generation_options(settings.max_new_tokens, most, settings.num_beams, task == "translate", why)
    loadtest = {
        "translate": task_file.TRANSLATION_LOADTEST,
        "summarize": 'file = "summarization/clge_lcsts_csl/lcsts_val.tsv"  # summary<TAB>text\ncolumn = 1',
    }[task]
    return f'''# Imported from the Hugging Face {architecture} folder {source.resolve()}
# by `python -m export.import_hf {source} --task {task} --name {name}{flags}`.
# The defaults below are its generation config's; edit them or the prompt here, then `make repository`.
summary = "{task} with {name} ({architecture} imported from Hugging Face); prints one answer per line"
example = 'python -m clients {name} "我爱你。"'
checkpoint = "{name}"
assets = {json.dumps(list(ASSETS))}

[prompt]
# The user's message: the text goes where {{text}} is. It is rendered with the checkpoint's chat template
# (chat_template.jinja), after a system message when `system` is not empty.
instruction = {json.dumps(INSTRUCTIONS[task], ensure_ascii=False)}
system = ""
{options}
[endpoint]
{endpoint}
outputs = [{{ name = "{OUTPUTS[task]}", type = "string" }}]

[stream]
{endpoint}

[chat]
# {name}_chat: a conversation (or a raw prompt) as the client wrote it, answered as a stream with why it ended
# and its token counts; the gateway's OpenAI API calls it. Sampling defaults: config.json's generation.sampling.
{chat}
outputs = [
  {{ name = "TEXT", type = "string" }},
  {{ name = "FINISH_REASON", type = "string" }},
  {{ name = "PROMPT_TOKENS", type = "int32" }},
  {{ name = "COMPLETION_TOKENS", type = "int32" }},
]

[loadtest]
weight = 1
{loadtest}
texts = ["我爱你。", "他休息两天。", "今天天气很好。", "你叫什么名字？"]
'''


def _model_card(source: Path, name: str, task: str, settings: causal_lm.CausalSettings, int8: bool) -> str:
    architecture = causal_lm.ARCHITECTURES[settings.model_type]
    ignored = ", ".join(settings.ignored) or "nothing"
    return f"""# {name}: {architecture} imported from Hugging Face for `{task}`

Imported from `{source.resolve()}` by `python -m export.import_hf`. The weights, tokenizer and licence are that
folder's: read its model card for what it was trained on and the terms of its use.

- {settings.layers} layers, hidden {settings.hidden}, {settings.heads} query heads and {settings.kv_heads} key/value \
heads of {settings.head_dim}, vocabulary {settings.vocab_size:,}, rotary `{settings.rope_type}`
- served context: {settings.context:,} tokens (prompt and answer)
- decoding (the task endpoints): {settings.num_beams} beams, ends at token ids {list(settings.eos_ids)}; left out of \
its generation config: {ignored}
- chat twin (`{name}_chat`, the OpenAI API's): samples by default with {dict(settings.sampling)}
- graph: decoder.onnx (tasks/generation_contract.py){", and its int8 twin" if int8 else ""}
"""
