"""A decoder-only chat model (Qwen2, Llama), imported (`python -m export.import_hf --task translate|summarize`), is
served with `generate`'s own tokens: offline through the engine, and by the real Triton server over gRPC and HTTP.

No hub is reachable here, so the folders are built with transformers' own classes and `save_pretrained`
(export/import_hf/sample_folders.py), trained briefly on Tatoeba in their chat templates so that their greedy
choices are not ties: a Qwen2 (ChatML, tied embeddings, 2 key/value heads for 4 query heads, rope_theta 1e6), a
Llama (Llama 3's template with its bos token in the text, one key/value head, untied, `rope_scaling` llama3), and
a configuration that no code names (YaRN, an explicit head_dim, other widths).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest

from export.import_hf.decoder_only import INSTRUCTIONS
from export.import_hf.sample_folders import TINY_LLAMA, TINY_QWEN2, CausalSize, build_causal_lm
from tasks import PATH_VARIABLE, load
from tasks import generation_contract as contract
from tests.prometheus_text import metric_sum, settled
from tests.test_import_marian import run, served_repository

MAX_NEW_TOKENS = 32
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def folders(corpus, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_causal")
    return {
        "qwen2": build_causal_lm(root / "qwen2", "qwen2", TINY_QWEN2, corpus[0]),
        "llama": build_causal_lm(root / "llama", "llama", TINY_LLAMA, corpus[0], rope_scaling=LLAMA3_SCALING),
    }


def import_folder(folder: Path, name: str, root: Path, task: str = "translate", *flags: str) -> tuple[Path, Path]:
    checkpoints, tasks = root / "checkpoints", root / "tasks"
    command = ["-m", "export.import_hf", str(folder), "--task", task, "--name", name, *flags]
    run(*command, "--checkpoints", str(checkpoints), "--tasks-dir", str(tasks))
    return checkpoints, tasks


@pytest.fixture(scope="module")
def imported(folders, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("imported_causal")
    import_folder(folders["qwen2"], "tiny_qwen", root)
    import_folder(folders["qwen2"], "tiny_qwen_summary", root, "summarize")
    return import_folder(folders["llama"], "tiny_llama", root)


def prompts(folder: Path, texts: list[str], task: str = "translate", system: str = "") -> list[list[int]]:
    """transformers' own prompt ids: apply_chat_template with the task's default instruction."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = []
    for text in texts:
        messages = [{"role": "user", "content": INSTRUCTIONS[task].replace("{text}", text)}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return out


def generate(folder: Path, ids: list[list[int]], num_beams: int, max_new_tokens: int = MAX_NEW_TOKENS):
    """`model.generate` one prompt at a time (no padding), the folder's generation config; eos ids left out."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    eos = set(GenerationConfig.from_pretrained(folder).eos_token_id)
    answers = []
    with torch.no_grad():
        for prompt in ids:
            out = model.generate(torch.tensor([prompt]), num_beams=num_beams, max_new_tokens=max_new_tokens)
            answers.append([t for t in out[0, len(prompt) :].tolist() if t not in eos])
    return answers


def engine_answers(checkpoint: Path, ids: list[list[int]], num_beams: int, max_new_tokens: int = MAX_NEW_TOKENS):
    from serving.engine.engine import Engine, Job

    engine = Engine.load(checkpoint, threads=2)
    answers: list[list[int]] = [[] for _ in ids]
    for row, prompt in enumerate(ids):
        engine.submit(Job(prompt, max_new_tokens, num_beams, lambda new, final, row=row: answers[row].extend(new)))
    engine.run_until_idle()
    return answers


def assert_identical(ours, theirs, what: str, distinct: float = 0.3) -> None:
    """Token-identical, every one, and not trivially: more than `distinct` of the prompts get answers of their own."""
    assert len({tuple(answer) for answer in theirs}) > distinct * len(theirs), f"{what}: prompts share answers"
    differing = [(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not differing, f"{what}: {len(differing)} of {len(theirs)} differ: {differing[:5]}"
    print(f"{what}: {len(theirs)} of {len(theirs)} token-identical")


@pytest.mark.export
def test_the_chat_template_renders_as_transformers_renders_it(folders, corpus):
    """Our sandboxed renderer plus the `tokenizers` file give apply_chat_template's ids, a system message and odd
    text included; the Llama template's bos token comes from the tokenizer config."""
    from tokenizers import Tokenizer

    from export.import_hf.decoder_only import chat_template, special_tokens
    from serving.text.chat import ChatPrompt

    odd = ["  我  爱你  ", "Ｈｅｌｌｏ，世界！", "naïve café 😀", 'quote " and {{ braces }} {% raw %}']
    for arch, folder in folders.items():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        specials = tuple(special_tokens(folder).items())
        for system in ("", "你是一名翻译。"):
            chat = ChatPrompt(chat_template(folder), INSTRUCTIONS["translate"], system, specials)
            texts = corpus[1][:20] + odd
            ours = [tokenizer.encode(chat(text), add_special_tokens=False).ids for text in texts]
            assert ours == prompts(folder, texts, system=system), (arch, system)
        if arch == "llama":
            assert chat("我").startswith("<|begin_of_text|>")


@pytest.mark.export
def test_the_graphs_follow_the_contract_with_grouped_heads_and_fused_rotary(imported):
    checkpoints, tasks = imported
    for name, size in (("tiny_qwen", TINY_QWEN2), ("tiny_llama", TINY_LLAMA)):
        folder = checkpoints / name
        assert contract.is_decoder_only(folder) and contract.check_graphs(folder) == []
        assert [f.name for f in folder.glob("*.onnx")] == [contract.DECODER_FILE]  # one graph, one copy of weights
        step = onnx.load(str(folder / contract.DECODER_FILE)).graph
        ops = [node.op_type for node in step.node]
        assert ops.count("GroupQueryAttention") == size.layers and "Softmax" not in ops
        assert ops.count("RotaryEmbedding") == 2 * size.layers  # on Q and on K
        heads = {
            a.i
            for n in step.node
            if n.op_type == "GroupQueryAttention"
            for a in n.attribute
            if a.name == "kv_num_heads"
        }
        assert heads == {size.kv_heads}
        past = next(i for i in step.input if i.name == "past_key_self_0")
        assert past.type.tensor_type.shape.dim[1].dim_value == size.kv_heads  # the cache holds the grouped heads
    task = load(tasks / "tiny_qwen_summary.toml")
    assert task.endpoint.outputs[0].name == "SUMMARY" and task.prompt.instruction == INSTRUCTIONS["summarize"]
    assert [o.keyword for o in task.options] == ["max_new_tokens", "num_beams"]


@pytest.mark.export
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_and_beam_answers_are_generates_tokens(folders, corpus, imported, arch):
    """200 held-out prompts greedy, 100 at beam 4, offline through the engine (rows joining and leaving one batch)."""
    checkpoints, _ = imported
    checkpoint = checkpoints / {"qwen2": "tiny_qwen", "llama": "tiny_llama"}[arch]
    ids = prompts(folders[arch], corpus[1])
    assert_identical(engine_answers(checkpoint, ids, 1), generate(folders[arch], ids, 1), f"{arch} greedy")
    ids = ids[:100]
    assert_identical(engine_answers(checkpoint, ids, 4), generate(folders[arch], ids, 4), f"{arch} beam 4")


@pytest.mark.export
def test_an_unseen_configuration_imports_and_decodes_as_generate(corpus, tmp_path):
    """Other layer counts, widths, heads, head_dim, rope_theta and a YaRN rope_scaling than any other test's."""
    size = CausalSize(3, 48, 6, 3, 96, 2000, 250, rope_theta=2e4, head_dim=16, tied=False)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    folder = build_causal_lm(tmp_path / "unseen", "qwen2", size, corpus[0], seed=3, rope_scaling=yarn)
    checkpoints, _ = import_folder(folder, "unseen_lm", tmp_path)
    ids = prompts(folder, corpus[1][:120])
    assert_identical(engine_answers(checkpoints / "unseen_lm", ids, 1), generate(folder, ids, 1), "unseen greedy")


UNSUPPORTED = {  # file, key, value, what the error names
    "model_type": ("config.json", "model_type", "gpt_neox", "config.model_type = 'gpt_neox'"),
    "dynamic": ("config.json", "rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope_type = 'dynamic'"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_folder_is_refused_by_its_field_and_nothing_is_written(folders, tmp_path, case):
    folder = tmp_path / "changed"
    shutil.copytree(folders["qwen2"], folder)
    file, key, value, message = UNSUPPORTED[case]
    config = json.loads((folder / file).read_text())
    if key == "rope_scaling":
        config.pop("rope_parameters", None)
    (folder / file).write_text(json.dumps({**config, key: value}))
    command = ["-m", "export.import_hf", str(folder), "--task", "translate", "--name", "changed"]
    result = run(*command, "--checkpoints", str(tmp_path / "ck"), "--tasks-dir", str(tmp_path / "tasks"), check=False)
    assert result.returncode == 2 and message in result.stderr and "nothing was written" in result.stderr, result.stderr
    assert not (tmp_path / "tasks").exists() and not any((tmp_path / "ck").glob("*"))


def test_a_sampling_folder_imports_its_sampling_as_the_chat_twins_defaults(folders, tmp_path):
    """Qwen2.5's generation config samples: the task endpoints decode greedily (the card says what they leave
    out), the chat twin samples with the folder's settings unless a request says otherwise."""
    folder = tmp_path / "sampling"
    shutil.copytree(folders["qwen2"], folder)
    config = json.loads((folder / "generation_config.json").read_text())
    sampling = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    (folder / "generation_config.json").write_text(json.dumps({**config, **sampling}))
    checkpoints, tasks = import_folder(folder, "sampled_lm", tmp_path, "translate")
    card = (checkpoints / "sampled_lm" / "README.md").read_text()
    assert "do_sample = True" in card and "repetition_penalty = 1.05" in card and "top_k = 20" in card
    written = json.loads((checkpoints / "sampled_lm" / "config.json").read_text())["generation"]["sampling"]
    assert written == {key: float(value) for key, value in sampling.items() if key != "do_sample"}
    assert load(tasks / "sampled_lm.toml").chat.name == "sampled_lm_chat"


@pytest.mark.export
def test_a_failed_import_keeps_the_model_it_would_have_replaced(folders, tmp_path, monkeypatch):
    """The staging folder: graphs that decode otherwise than `generate` (here, rotated the wrong way) are caught
    by the importer's own check, and the model it would have replaced stays as it was."""
    from export.import_hf import causal_lm, decoder_only

    checkpoints, tasks = import_folder(folders["qwen2"], "kept_lm", tmp_path)
    before = (checkpoints / "kept_lm" / "decoder.onnx").read_bytes()
    tables = causal_lm.rope_tables
    monkeypatch.setattr(
        causal_lm, "rope_tables", lambda model, context: (tables(model, context)[0], -tables(model, context)[1])
    )
    with pytest.raises(RuntimeError, match="do not decode as transformers does"):
        decoder_only.import_causal_lm(folders["qwen2"], "kept_lm", "translate", checkpoints, tasks, say=lambda _: None)
    assert (checkpoints / "kept_lm" / "decoder.onnx").read_bytes() == before
    assert not list(checkpoints.glob(".*staging"))


@pytest.mark.server
def test_the_server_answers_with_generates_tokens(folders, corpus, imported, tmp_path, monkeypatch):
    """Served over gRPC and HTTP, greedy, both folders on 200 prompts: the answers are `generate`'s, decoded as
    transformers decodes them; the stream joins to the answer; a paragraph is read as its sentences; the summarize
    task answers SUMMARY with its own instruction."""
    from transformers import AutoTokenizer

    from clients import Client
    from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports

    checkpoints, tasks_dir = imported
    monkeypatch.setenv(PATH_VARIABLE, str(tasks_dir))
    tasks = ("tiny_qwen", "tiny_qwen_summary", "tiny_llama")
    repository = served_repository(tasks, checkpoints, tmp_path / "repository")

    texts = corpus[1]
    expected = {}
    for name, arch, task in (("tiny_qwen", "qwen2", "translate"), ("tiny_llama", "llama", "translate")):
        decode = AutoTokenizer.from_pretrained(folders[arch]).decode
        answers = generate(folders[arch], prompts(folders[arch], texts, task), 1)
        expected[name] = [decode(tokens, skip_special_tokens=True) for tokens in answers]
    summaries = generate(folders["qwen2"], prompts(folders["qwen2"], texts[:20], "summarize"), 1)
    decode = AutoTokenizer.from_pretrained(folders["qwen2"]).decode
    expected_summaries = [decode(tokens, skip_special_tokens=True) for tokens in summaries]

    http, grpc, metrics = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics)
    server = EmbeddedTriton(options)
    server.start()
    try:
        for name, protocol in (("tiny_qwen", "grpc"), ("tiny_qwen", "http"), ("tiny_llama", "grpc")):
            with Client(server.grpc_url if protocol == "grpc" else server.http_url, protocol) as client:
                answers = [
                    answer
                    for start in range(0, len(texts), 50)
                    for answer in client.infer(
                        name, texts[start : start + 50], num_beams=1, max_new_tokens=MAX_NEW_TOKENS, split_sentences="0"
                    )
                ]
                differing = [(t, a, w) for t, a, w in zip(texts, answers, expected[name]) if a != w]
                assert not differing, differing[:5]
                print(f"{name} over {protocol}: {len(texts)} of {len(texts)} as generate")
        with Client(server.grpc_url, "grpc") as client:
            for text, want in zip(texts[:10], expected["tiny_qwen"]):
                pieces = list(client.stream("tiny_qwen", text, num_beams=1, max_new_tokens=MAX_NEW_TOKENS))
                assert "".join(pieces) == want
            sentences = client.infer("tiny_llama", texts[:4], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
            (joined,) = client.infer("tiny_llama", ["".join(texts[:4])], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
            assert joined == " ".join(sentences)
            got = client.infer("tiny_qwen_summary", texts[:20], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
            assert got == expected_summaries
        # Every prompt starts with the chat template's opening and the task's instruction: after the first, their
        # whole blocks are copied from the prefix cache, and the counters say so (the answers above are exact).
        counts = settled(
            lambda: [metric_sum(server.metrics_url, f"ropeserve_engine_prefix_cache_{kind}_tokens_total",
                                model="tiny_qwen") for kind in ("queried", "hit")],
            lambda counts: counts[0] > 0,
        )  # fmt: skip
        shared = len(os.path.commonprefix(prompts(folders["qwen2"], texts[:2]))) // 16 * 16
        assert shared >= 16 and counts[1] >= (2 * len(texts) - 2) * shared * 0.5, (counts, shared)
    finally:
        server.stop()


def test_tasks_check_names_a_step_graph_that_reads_one_token_per_row(imported, tmp_path):
    """A decoder-only step with a fixed token count cannot read prompts in chunks: named, with what to do."""
    checkpoints, _ = imported
    folder = tmp_path / "broken"
    shutil.copytree(checkpoints / "tiny_qwen", folder)
    step = onnx.load(str(folder / contract.DECODER_FILE))
    tokens = step.graph.input[0].type.tensor_type.shape.dim[1]
    tokens.Clear()
    tokens.dim_value = 1
    onnx.save(step, str(folder / contract.DECODER_FILE))
    (problem,) = contract.check_graphs(folder)
    assert "reads 1 token(s) per row" in problem and "import the model again" in problem


@pytest.mark.export
def test_a_folder_of_qwen25_05b_instructs_shape_decodes_as_generate(corpus, tmp_path):
    """24 layers, hidden 896, 14 query and 2 key/value heads, 151,936 embedding rows, tied, rope_theta 1e6: the
    graphs keep their 2 GB of weights beside them (external data), and 50 prompts decode as `generate` does."""
    from export.import_hf.sample_folders import QWEN25_05B

    folder = build_causal_lm(tmp_path / "qwen25", "qwen2", QWEN25_05B, corpus[0])
    config = json.loads((folder / "config.json").read_text())
    shape = [config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")]
    assert shape == [24, 896, 14, 2] and config["vocab_size"] == 151_936 and config["tie_word_embeddings"]
    checkpoints, _ = import_folder(folder, "qwen25_shaped", tmp_path)
    checkpoint = checkpoints / "qwen25_shaped"
    assert all((checkpoint / f"{file}.data").stat().st_size > 1e9 for file in contract.graph_files("fp32", True))
    ids = prompts(folder, corpus[1][:50])
    ours = engine_answers(checkpoint, ids, 1, max_new_tokens=8)
    assert_identical(ours, generate(folder, ids, 1, max_new_tokens=8), "Qwen2.5-0.5B-shaped greedy")


def test_openais_client_gets_generates_tokens_streams_samples_and_errors(
    folders, corpus, imported, tmp_path, monkeypatch
):
    """The official `openai` client against the gateway, in front of the real server's `tiny_qwen_chat`: at
    temperature 0, 200 conversations answered with `generate`'s tokens and their usage counted as transformers
    counts them; a stream joins to its answer; a raw prompt (/v1/completions) answers as the conversation it
    renders; a seed repeats its sampled answer; a stop string ends the answer before it; refusals in OpenAI's
    shape and status."""
    import openai
    from transformers import AutoTokenizer

    from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
    from serving.launcher.gateway import Gateway, GatewayOptions

    checkpoints, tasks_dir = imported
    monkeypatch.setenv(PATH_VARIABLE, str(tasks_dir))
    repository = served_repository(("tiny_qwen",), checkpoints, tmp_path / "repository")
    folder = folders["qwen2"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = corpus[1]
    ids = prompts(folder, texts)
    answers = generate(folder, ids, 1)
    expected = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in answers]

    def conversation(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": INSTRUCTIONS["translate"].replace("{text}", text)}]

    http, grpc, metrics, port = free_ports(4)
    server = EmbeddedTriton(ServerOptions(model_repository=repository, http_port=http, grpc_port=grpc,
                                          metrics_port=metrics))  # fmt: skip
    server.start()
    try:
        with Gateway(GatewayOptions(triton_grpc=server.grpc_url, port=port, translator="tiny_qwen")):
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
            assert [model.id for model in client.models.list()] == ["tiny_qwen"]

            def ask(text: str):
                return client.chat.completions.create(
                    model="tiny_qwen", messages=conversation(text), temperature=0, max_tokens=MAX_NEW_TOKENS
                )

            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(16) as pool:
                completions = list(pool.map(ask, texts))
            differing = [(t, c.choices[0].message.content, w) for t, c, w in zip(texts, completions, expected)
                         if c.choices[0].message.content != w]  # fmt: skip
            assert not differing, differing[:5]
            for completion, prompt, tokens in zip(completions, ids, answers):
                assert completion.usage.prompt_tokens == len(prompt)
                assert completion.usage.completion_tokens == len(tokens)
                assert completion.choices[0].finish_reason == ("length" if len(tokens) == MAX_NEW_TOKENS else "stop")
            print(f"openai client: {len(texts)} of {len(texts)} conversations as generate")

            for text, want in zip(texts[:10], expected):
                chunks = list(client.chat.completions.create(
                    model="tiny_qwen", messages=conversation(text), temperature=0, max_tokens=MAX_NEW_TOKENS,
                    stream=True, stream_options={"include_usage": True},
                ))  # fmt: skip
                assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
                assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
                assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0

            rendered = tokenizer.apply_chat_template(conversation(texts[0]), add_generation_prompt=True, tokenize=False)
            raw = client.completions.create(
                model="tiny_qwen", prompt=rendered, temperature=0, max_tokens=MAX_NEW_TOKENS
            )
            assert raw.choices[0].text == expected[0] and raw.usage.prompt_tokens == len(ids[0])

            def sampled(seed: int, text: str) -> str:  # flat enough that a tiny trained model's draws vary
                return ask_with(text, temperature=2.0, seed=seed, extra_body={"top_k": 0})

            def ask_with(text: str, **settings) -> str:
                completion = client.chat.completions.create(
                    model="tiny_qwen", messages=conversation(text), max_tokens=MAX_NEW_TOKENS, **settings
                )
                return completion.choices[0].message.content

            draws = [sampled(seed, texts[i]) for i in range(5) for seed in (5, 5, 6)]
            assert all(draws[3 * i] == draws[3 * i + 1] for i in range(5)), "the same seed repeats"
            assert any(draws[3 * i] != draws[3 * i + 2] for i in range(5)), "another seed draws another answer"
            assert any(draws[3 * i] != expected[i] for i in range(5)), "sampled, not greedy"

            i, word = next((i, w.split()[1]) for i, w in enumerate(expected) if len(w.split()) > 2)
            cut = client.chat.completions.create(
                model="tiny_qwen",
                messages=conversation(texts[i]),
                temperature=0,
                max_tokens=MAX_NEW_TOKENS,
                stop=[" " + word],
            )
            assert cut.choices[0].message.content == expected[i][: expected[i].index(" " + word)]
            assert cut.choices[0].finish_reason == "stop"

            page_translates_with("tiny_qwen", f"http://127.0.0.1:{port}", texts[:2])
            deepl_and_libretranslate_translate_with("tiny_qwen", f"http://127.0.0.1:{port}", texts[2:5])

            with pytest.raises(openai.NotFoundError) as missing:
                client.chat.completions.create(model="gpt-4o", messages=conversation(texts[0]))
            assert missing.value.body["code"] == "model_not_found"
            refusals = [({"temperature": 3}, "temperature"), ({"n": 2}, "n"), ({"extra_body": {"top_q": 1}}, "top_q")]
            for settings, param in refusals:
                with pytest.raises(openai.BadRequestError) as refused:
                    client.chat.completions.create(model="tiny_qwen", messages=conversation(texts[0]), **settings)
                assert refused.value.body["param"] == param, refused.value.body
            with pytest.raises(openai.BadRequestError) as too_long:
                client.chat.completions.create(model="tiny_qwen", messages=conversation(texts[0]), max_tokens=10**6)
            assert too_long.value.body["code"] == "context_length_exceeded"
    finally:
        server.stop()


def page_translates_with(model: str, gateway_url: str, texts: list[str]) -> None:
    """The gateway's page offers the served translators (here the imported one alone: the built-in `translate` is
    defined but not served); picked, it streams that model's answer (the API's, greedy), and its sentences offer
    no alignment (it has no explain twin)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.test_gateway_page import chromium, enter_text, options_of, post, state, text_of, wait

    text = "".join(texts)
    expected = post(f"{gateway_url}/v1/{model}", {"texts": [text], "num_beams": 1})["results"][0]
    with chromium() as driver:
        driver.get(gateway_url + "/")
        wait(driver, lambda d: model in options_of(d, "translator"), f"{model} is not offered")
        assert options_of(driver, "translator") == [model]
        Select(driver.find_element(By.ID, "translator")).select_by_value(model)
        enter_text(driver, text)
        driver.find_element(By.ID, "translate").click()
        wait(driver, lambda d: state(d) in ("done", "error"), "the translation stream never finished")
        assert state(driver) == "done", text_of(driver, "error")
        assert text_of(driver, "translation") == expected
        spans = driver.find_elements(By.CSS_SELECTOR, "#translation .sentence")
        assert len(spans) == len(texts) and not any(span.get_attribute("role") for span in spans)


def deepl_and_libretranslate_translate_with(model: str, gateway_url: str, texts: list[str]) -> None:
    """With `--translator`, DeepL's and LibreTranslate's APIs answer with that model's translations."""
    import urllib.parse
    import urllib.request

    from tests.test_gateway_page import post

    expected = post(f"{gateway_url}/v1/{model}", {"texts": texts})["results"]
    form = urllib.parse.urlencode([("target_lang", "EN-US"), *(("text", text) for text in texts)]).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{gateway_url}/v2/translate", data=form), timeout=60) as got:
        assert [t["text"] for t in json.loads(got.read())["translations"]] == expected
    libre = post(f"{gateway_url}/translate", {"q": texts, "source": "zh", "target": "en"})
    assert libre["translatedText"] == expected
