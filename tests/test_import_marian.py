"""A Hugging Face MarianMTModel folder, imported (`python -m export.import_hf --task translate`), is served with
`generate`'s own tokens: offline through the engine, and by the real Triton server over gRPC and HTTP.

No hub is reachable here, so the folders are built with transformers' own classes and `save_pretrained`
(export/import_hf/sample_folders.py): a small one, one of opus-mt-zh-en's shape (6 + 6 layers, d_model 512,
8 heads, a vocabulary over 30 k), and an unseen configuration that no code names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from export.import_hf.sample_folders import OPUS_MT, TINY, MarianSize, build_marian
from export.training.data import DEFAULT_DATA_DIR
from tasks import PATH_VARIABLE, load
from tasks import generation_contract as contract

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 48  # the same cap on both sides: at it, forced eos decides the last token on both
FLIPS_ALLOWED = 0.01  # fp32 rounding may flip a near-tie: at most 1% of sentences, each shown


@pytest.fixture(scope="module")
def folders(corpus, tmp_path_factory) -> dict[str, Path]:
    """Sample folders, built once: the small one and the opus-mt-sized one."""
    root = tmp_path_factory.mktemp("hf")
    return {
        "tiny": build_marian(root / "tiny", TINY, corpus[0]),
        "opus": build_marian(root / "opus", OPUS_MT, corpus[0]),
    }


def import_folder(folder: Path, name: str, root: Path, *flags: str) -> tuple[Path, Path]:
    """Run the importer's command; (checkpoints, tasks) folders it wrote into."""
    checkpoints, tasks = root / "checkpoints", root / "tasks"
    command = ["-m", "export.import_hf", str(folder), "--task", "translate", "--name", name, *flags]
    run(*command, "--checkpoints", str(checkpoints), "--tasks-dir", str(tasks))
    return checkpoints, tasks


def served_repository(tasks: tuple[str, ...], checkpoints: Path, repository: Path) -> Path:
    """A model repository of the imported tasks (on $ROPESERVE_TASKS_PATH), built and checked as `make
    repository` builds and `python -m tasks check` checks ours."""
    names = [flag for name in tasks for flag in ("--task", name)]
    run("-m", "tasks", "generate", *names, "--repository", str(repository))
    run("-m", "export.build_repository", *names, "--repository", str(repository), "--checkpoints", str(checkpoints))
    assert run("-m", "tasks", "check", *names, "--repository", str(repository)).returncode == 0
    return repository


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, env=os.environ)
    if check and result.returncode != 0:
        raise AssertionError(f"{argv} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def imported(folders, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("imported")
    import_folder(folders["tiny"], "tiny_mt", root)
    import_folder(folders["tiny"], "tiny_int8", root, "--int8")
    return import_folder(folders["opus"], "opus_mt", root)


def generate(folder: Path, texts: list[str], num_beams: int, max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    """transformers' own answers: MarianTokenizer, then `model.generate` with the folder's generation config."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer, model = MarianTokenizer.from_pretrained(folder), MarianMTModel.from_pretrained(folder).eval()
    special = {model.config.pad_token_id, model.config.eos_token_id}
    answers = []
    with torch.no_grad():
        for start in range(0, len(texts), 16):
            batch = tokenizer(texts[start : start + 16], return_tensors="pt", padding=True)
            out = model.generate(**batch, num_beams=num_beams, max_new_tokens=max_new_tokens)
            answers += [[t for t in row[1:] if t not in special] for row in out.tolist()]
    return answers


def engine_answers(checkpoint: Path, texts: list[str], num_beams: int, max_new_tokens: int) -> list[list[int]]:
    """The imported graphs run offline by the serving engine, sources tokenized as the front model does."""
    from serving.engine.config import EngineConfig
    from serving.engine.engine import Engine, Job
    from serving.frontends.base import BatchTokenizer
    from serving.text.tokenizer import EOS_ID

    config = json.loads((checkpoint / "config.json").read_text())
    source = BatchTokenizer.from_file(checkpoint / "tokenizer.json", config["max_tokens"]).encode(texts, [EOS_ID])
    engine = Engine(checkpoint / "encoder.onnx", checkpoint / "decoder.onnx", EngineConfig.from_dict(config), 2)
    answers: list[list[int]] = [[] for _ in texts]
    for row, length in enumerate(source.lengths):
        tokens = source.ids[row, :length].tolist()
        engine.submit(Job(tokens, max_new_tokens, num_beams, lambda new, final, row=row: answers[row].extend(new)))
    engine.run_until_idle()
    return answers


def assert_same_tokens(
    ours: list[list[int]], theirs: list[list[int]], texts: list[str], what: str, distinct: float = 0.5
) -> None:
    """At most FLIPS_ALLOWED of the sentences differ, and the comparison is not trivial: the model gives more than
    `distinct` of them answers of their own."""
    assert len({tuple(answer) for answer in theirs}) > distinct * len(texts), f"{what}: sources share answers"
    flips = [f"{text!r}: ours {a} generate {b}" for text, a, b in zip(texts, ours, theirs) if a != b]
    assert len(flips) <= FLIPS_ALLOWED * len(texts), f"{what}: {len(flips)} of {len(texts)} differ:\n" + "\n".join(
        flips
    )
    print(f"{what}: {len(texts) - len(flips)} of {len(texts)} token-identical; differing: {flips}")


@pytest.mark.export
def test_the_source_tokenizer_gives_marian_ids(folders, corpus, imported):
    """The front model's tokenizer (the `tokenizers` file and its unknown pieces) plus the encoder's id map give
    MarianTokenizer's ids, characters its SentencePiece model does not know included."""
    from transformers import MarianTokenizer

    from export.import_hf.sentencepiece_json import read_vocab, source_tokenizer
    from serving.frontends.base import BatchTokenizer
    from serving.text.tokenizer import EOS_ID

    checkpoints, _ = imported
    hf = MarianTokenizer.from_pretrained(folders["tiny"])
    ours = BatchTokenizer.from_file(checkpoints / "tiny_mt" / "tokenizer.json", 512)
    assert ours.unknown_pieces
    vocab = read_vocab(folders["tiny"])
    *_, table = source_tokenizer(folders["tiny"] / "source.spm", vocab, "<unk>", "</s>", "<pad>")
    odd = ["  我  爱你  ", "Ｈｅｌｌｏ，世界！", "abc 123 我xyz爱", "naïve café 😀", "Wienczysława是这个工作场所的。"]
    for text in corpus[1] + odd:
        mapped = [table[i] for i in ours.token_ids([text])[0]] + [table[EOS_ID]]
        assert mapped == hf(text)["input_ids"], text


@pytest.mark.export
def test_the_graphs_follow_the_contract_with_one_fused_attention_per_attention(folders, imported):
    checkpoints, tasks = imported
    for name, layers in (("tiny_mt", TINY.decoder_layers), ("opus_mt", OPUS_MT.decoder_layers)):
        folder = checkpoints / name
        assert contract.check_graphs(folder) == []
        encoder, decoder = (onnx.load(str(folder / file)).graph for file in contract.graph_files())
        ops = [node.op_type for node in decoder.node]
        assert ops.count("GroupQueryAttention") == layers and ops.count("MultiHeadAttention") == layers
        assert [node.op_type for node in encoder.node].count("MultiHeadAttention") == layers
        assert "Softmax" not in ops  # every attention fused
    assert contract.check_graphs(checkpoints / "tiny_int8", "int8") == []
    if (DEFAULT_DATA_DIR / "translation" / "extra").is_dir():  # opus-mt-zh-en's vocabulary is 65 k
        assert json.loads((folders["opus"] / "config.json").read_text())["vocab_size"] >= 30_000
    task = load(tasks / "tiny_int8.toml")
    assert (task.option("num_beams").default, task.endpoint.precision, task.stream.name) == (
        4,
        "int8",
        "tiny_int8_stream",
    )


@pytest.mark.export
@pytest.mark.parametrize("num_beams", [1, 4])
def test_an_unseen_configuration_imports_and_decodes_as_generate(corpus, tmp_path, num_beams):
    """Other layer counts, widths, heads and vocabularies than any other test's: nothing is special-cased."""
    size = MarianSize(3, 2, 96, 6, 160, 3000, 900, 600)
    folder = build_marian(tmp_path / "unseen", size, corpus[0], seed=3)
    checkpoints, _ = import_folder(folder, "unseen_mt", tmp_path)
    texts = corpus[1][:120]
    ours = engine_answers(checkpoints / "unseen_mt", texts, num_beams, MAX_NEW_TOKENS)
    assert_same_tokens(ours, generate(folder, texts, num_beams), texts, f"unseen config, {num_beams} beams")


@pytest.mark.export
@pytest.mark.parametrize("num_beams", [1, 4])
def test_at_the_length_cap_the_last_token_is_forced_eos_as_in_generate(folders, corpus, imported, num_beams):
    checkpoints, _ = imported
    texts = corpus[1][:60]
    ours = engine_answers(checkpoints / "tiny_mt", texts, num_beams, 4)
    theirs = generate(folders["tiny"], texts, num_beams, max_new_tokens=4)
    assert any(len(answer) == 3 for answer in theirs)  # the cap was reached: 3 tokens, then the forced eos
    assert_same_tokens(ours, theirs, texts, f"cap of 4 tokens, {num_beams} beams", distinct=0.2)


UNSUPPORTED = {
    "generation_config.json": ("do_sample", True, "generation_config.do_sample = True"),
    "config.json": ("model_type", "bart", "config.model_type = 'bart'"),
}


@pytest.mark.parametrize("file", sorted(UNSUPPORTED))
def test_an_unsupported_folder_is_refused_by_its_field_and_nothing_is_written(folders, tmp_path, file):
    folder = tmp_path / "changed"
    subprocess.run(["cp", "-r", str(folders["tiny"]), str(folder)], check=True)
    key, value, message = UNSUPPORTED[file]
    config = json.loads((folder / file).read_text())
    (folder / file).write_text(json.dumps({**config, key: value}))
    command = ["-m", "export.import_hf", str(folder), "--task", "translate", "--name", "changed"]
    result = run(*command, "--checkpoints", str(tmp_path / "ck"), "--tasks-dir", str(tmp_path / "tasks"), check=False)
    assert result.returncode == 2 and message in result.stderr and "nothing was written" in result.stderr
    assert not (tmp_path / "ck").exists() and not (tmp_path / "tasks").exists()


@pytest.mark.server
def test_the_server_answers_with_generates_tokens(folders, corpus, imported, tmp_path, monkeypatch):
    """Served over gRPC and HTTP, greedy and beam 4, the small folder and the opus-mt-sized one: the answers are
    `generate`'s, detokenized as MarianTokenizer does; the stream joins to the answer; a paragraph is read as its
    sentences."""
    from transformers import MarianTokenizer

    from clients import Client
    from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports

    checkpoints, tasks_dir = imported
    monkeypatch.setenv(PATH_VARIABLE, str(tasks_dir))
    repository = served_repository(("tiny_mt", "tiny_int8", "opus_mt"), checkpoints, tmp_path / "repository")

    texts = corpus[1]
    cases = [("tiny_mt", "tiny", "grpc"), ("tiny_mt", "tiny", "http"), ("opus_mt", "opus", "grpc")]
    expected = {}
    for name, size, _ in cases:
        decode = MarianTokenizer.from_pretrained(folders[size]).decode
        for beams in (1, 4):
            if (name, beams) not in expected:
                answers = generate(folders[size], texts, beams)
                expected[name, beams] = [decode(tokens, skip_special_tokens=True) for tokens in answers]
                distinct = len(set(expected[name, beams]))
                assert distinct > len(texts) // 4, (name, beams, expected[name, beams][:3])  # not trivial
    http, grpc, metrics = free_ports(3)
    options = ServerOptions(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics)
    server = EmbeddedTriton(options)
    server.start()
    try:
        for name, _, protocol in cases:
            with Client(server.grpc_url if protocol == "grpc" else server.http_url, protocol) as client:
                for beams in (1, 4):
                    answers = [
                        answer
                        for start in range(0, len(texts), 50)  # a request holds at most max_batch_size (64) texts
                        for answer in client.infer(
                            name,
                            texts[start : start + 50],
                            num_beams=beams,
                            max_new_tokens=MAX_NEW_TOKENS,
                            split_sentences="0",
                        )
                    ]
                    flips = [(t, a, w) for t, a, w in zip(texts, answers, expected[name, beams]) if a != w]
                    assert len(flips) <= FLIPS_ALLOWED * len(texts), flips
                    print(
                        f"{name} over {protocol}, {beams} beams: {len(texts) - len(flips)} of {len(texts)} as generate"
                    )
        with Client(server.grpc_url, "grpc") as client:
            text = texts[0]
            (whole,) = client.infer("opus_mt", [text], num_beams=4, max_new_tokens=MAX_NEW_TOKENS)
            assert "".join(client.stream("opus_mt", text, num_beams=4, max_new_tokens=MAX_NEW_TOKENS)) == whole
            paragraph = "".join(texts[:6])
            sentences = client.infer("opus_mt", texts[:6], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
            (joined,) = client.infer("opus_mt", [paragraph], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
            assert joined == " ".join(sentences)
            int8 = client.infer("tiny_int8", texts[:20], num_beams=4, max_new_tokens=MAX_NEW_TOKENS)
            assert all(answer.strip() for answer in int8)
    finally:
        server.stop()


@pytest.mark.export
def test_the_contract_names_what_a_graph_breaks_and_the_engine_serves_no_more_beams_than_its_top_k(imported, tmp_path):
    from serving.engine.config import EngineConfig
    from serving.engine.engine import Engine, Job

    checkpoints, _ = imported
    folder = tmp_path / "broken"
    shutil.copytree(checkpoints / "tiny_mt", folder)
    decoder = onnx.load(str(folder / contract.DECODER_FILE))
    decoder.graph.input[1].name = "position_ids"
    onnx.save(decoder, str(folder / contract.DECODER_FILE))
    (problem,) = contract.check_graphs(folder)
    assert "position_ids" in problem and "'positions'" in problem
    assert contract.check_graphs(folder, "int8") == [
        f"{folder / name} is missing" for name in contract.graph_files("int8")
    ]

    good = checkpoints / "tiny_mt"
    engine = Engine(good / "encoder.onnx", good / "decoder.onnx", EngineConfig.read(good / "config.json"), 1)
    assert engine.layout.max_beams == contract.MAX_BEAMS
    with pytest.raises(ValueError, match=f"num_beams must be between 1 and {contract.MAX_BEAMS}"):
        engine.submit(Job([5, 3], 8, contract.MAX_BEAMS + 1, lambda tokens, final: None))
    assert not engine.busy()


@pytest.mark.export
def test_tasks_check_refuses_a_beam_range_the_graphs_do_not_serve(imported, tmp_path):
    from tasks.__main__ import generation_problems

    checkpoints, tasks = imported
    version = tmp_path / "repository" / "tiny_mt" / "1"
    version.mkdir(parents=True)
    for file in contract.graph_files():
        shutil.copy2(checkpoints / "tiny_mt" / file, version / file)
    assert generation_problems(load(tasks / "tiny_mt.toml"), tmp_path / "repository") == []
    wider = tmp_path / "tiny_mt.toml"
    wider.write_text((tasks / "tiny_mt.toml").read_text().replace("range = [1, 8]", "range = [1, 12]"))
    (problem,) = generation_problems(load(wider), tmp_path / "repository")
    assert "num_beams goes up to 12; the graphs serve 8" in problem
