"""One definition per task: the committed configs are generated from it, bad definitions are named, and a task
of one's own (a definition, a task module and its data, in a folder outside this package) is served."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from tokenizers import Tokenizer, models, pre_tokenizers

from clients import Client, ClientError
from loadtest.texts import add_option_flags, inputs_for, load_texts, parse_mix
from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
from tasks import PATH_VARIABLE, DefinitionError, load, registry, triton_config
from tasks.definition import EngineSettings

ROOT = Path(__file__).resolve().parents[1]


def test_committed_configs_are_what_the_definitions_generate():
    tasks = registry(())
    assert {"sentiment", "translate", "summarize"} <= set(tasks)
    for task in tasks.values():
        assert triton_config.drift(task, ROOT / "model_repository") == [], f"run `python -m tasks generate` ({task})"


def test_drift_is_reported_per_file(tmp_path):
    task = registry(())["translate"]
    triton_config.write(task, tmp_path)
    config = tmp_path / "translate" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_queue_size: 64", "max_queue_size: 65"))
    (tmp_path / "translate_generator" / "configs" / "cpu.pbtxt").unlink()
    assert sorted(triton_config.drift(task, tmp_path)) == [
        f"{config} differs from tasks/translate.toml",
        f"{tmp_path / 'translate_generator' / 'configs' / 'cpu.pbtxt'} is missing",
    ]


def test_the_front_config_carries_every_option_as_an_optional_input_of_its_type(wordcount_folder):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    translate, wordcount = registry(())["translate"], load(wordcount_folder / "wordcount.toml")
    for task, expected in (
        (translate, {"MAX_NEW_TOKENS": pb.TYPE_INT32, "NUM_BEAMS": pb.TYPE_INT32, "SPLIT_SENTENCES": pb.TYPE_STRING}),
        (wordcount, {"SCALE": pb.TYPE_INT32, "UNIT": pb.TYPE_STRING}),  # a string option is BYTES
    ):
        text = triton_config.front_config(task, task.endpoint)
        config = text_format.Parse(text, pb.ModelConfig())
        optional = {i.name: (i.data_type, list(i.dims)) for i in config.input if i.optional}
        assert optional == {name: (kind, [1]) for name, kind in expected.items()}
        assert config.dynamic_batching.default_queue_policy.max_queue_size == task.endpoint.queue_size
    assert "optional SCALE, UNIT (defaults, ranges and choices: tasks/wordcount.toml)" in " ".join(
        line.lstrip("# ") for line in text.splitlines()
    )


def test_a_string_option_has_choices_and_a_default_among_them(wordcount_folder):
    scale, unit = load(wordcount_folder / "wordcount.toml").options
    assert (scale.type, scale.default, scale.low, scale.high, scale.choices) == ("int32", 1, 1, 10, ())
    assert (unit.type, unit.default, unit.choices, unit.flags) == ("string", "words", ("words", "chars"), ("--unit",))
    assert (scale.allowed, unit.allowed) == ("1..10", "one of words, chars")
    listed = run("-m", "tasks", "list", "--task", "wordcount").stdout
    assert "scale 1..10 (default 1); unit one of words, chars (default words)" in listed


BAD_DEFINITIONS = {
    "default outside its range": ("range = [1, 8]", "range = [5, 8]", "default: 4 is outside range [5, 8]"),
    "unknown key": ('help = "beam width; 1 is greedy"', 'helps = "x"', "helps: unknown key"),
    "unknown type": ('type = "fp32", dims = [-1, -1, -1] }', 'type = "fp16", dims = [-1] }', "type: must be one of"),
    "model without a source": ('export = "export.build_repository:explainer"\n', "", "give exactly one"),
    "unknown precision": ("threads = 1\n", 'threads = 1\nprecision = "int4"\n', "precision: must be fp32 or int8"),
    # string options: `choices` instead of `range`, and a default among them
    "range and choices": ("range = [1, 8]", 'range = [1, 8]\nchoices = ["a"]', "range/choices: give one"),
    "default not a choice": (
        "default = 4\nrange = [1, 8]",
        'default = "x"\nchoices = ["a", "b"]',
        "default: 'x' is not one",
    ),
    "int default of a string option": (
        "default = 4\nrange = [1, 8]",
        'default = 4\nchoices = ["a"]',
        "default: must be str",
    ),
    "string default of an int option": ("default = 4\n", 'default = "4"\n', "default: must be int, got '4'"),
    "empty choices": (
        "default = 4\nrange = [1, 8]",
        'default = "a"\nchoices = []',
        "choices: must be a non-empty list",
    ),
    "repeated choice": ("default = 4\nrange = [1, 8]", 'default = "a"\nchoices = ["a", "a"]', "distinct non-empty"),
    "empty choice": ("default = 4\nrange = [1, 8]", 'default = "a"\nchoices = ["a", ""]', "distinct non-empty"),
    # the engine's knobs
    "unknown engine knob": ("max_rows = 256\n", "max_rows = 256\nmax_beams = 4\n", "max_beams: unknown key"),
    "engine knob not positive": ("max_rows = 256\n", "max_rows = 0\n", "max_rows: must be positive"),
    "engine knob of the wrong type": ("interactive_sentences = 4\n", 'interactive_sentences = "4"\n', "must be int"),
    "queue smaller than the batch": ("max_queued_rows = 1024\n", "max_queued_rows = 128\n", "must be at least"),
}


@pytest.mark.parametrize("case", BAD_DEFINITIONS)
def test_a_bad_definition_names_the_file_and_the_field(tmp_path, case):
    old, new, message = BAD_DEFINITIONS[case]
    text = (ROOT / "tasks" / "translate.toml").read_text()
    assert old in text
    path = tmp_path / "translate.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(DefinitionError, match=re.escape(message)) as err:
        load(path)
    assert str(path) in str(err.value)


def test_the_engine_table_is_read_and_a_task_without_one_gets_the_defaults(tmp_path):
    text = (ROOT / "tasks" / "translate.toml").read_text()
    path = tmp_path / "translate.toml"
    path.write_text(
        text.replace("max_rows = 256\n", "max_rows = 64\n").replace(
            "interactive_hold_s = 0.5", "interactive_hold_s = 2"
        )
    )
    settings = load(path).engine
    assert (settings.max_rows, settings.interactive_hold_s) == (64, 2.0)
    assert isinstance(settings.interactive_hold_s, float)
    assert load(ROOT / "tasks" / "summarize.toml").engine == EngineSettings()


def test_a_second_definition_of_a_task_is_refused(tmp_path):
    (tmp_path / "translate.toml").write_text((ROOT / "tasks" / "translate.toml").read_text())
    with pytest.raises(DefinitionError, match="already defined"):
        registry((str(tmp_path),))


# ---- a fourth task: word counting, defined, built and served from a temporary folder --------------------------

DEFINITION = """\
summary = "count the words of English text; prints one count per line"
example = 'python -m clients wordcount "a b c" --scale 2'
assets = ["tokenizer.json"]

[options.scale]
input = "SCALE"
default = 1
range = [1, 10]
help = "multiply the count"

[options.unit]
input = "UNIT"
default = "words"
choices = ["words", "chars"]
help = "what to count"

[endpoint]
front = "wordcount:WordCountFront"
max_batch_size = 16
instances = 1
queue = { max_size = 8, timeout_s = 2 }
outputs = [{ name = "COUNT", type = "fp32" }]

[endpoint.models.counter]
name = "wordcount_counter"
file = "counter.onnx"
about = "Sums the attention mask: the number of tokens per row."
inputs = [
  { name = "input_ids", type = "int64", dims = [-1, -1] },
  { name = "attention_mask", type = "int64", dims = [-1, -1] },
]
outputs = [{ name = "count", type = "fp32", dims = [-1, 1] }]
threads = 1

[loadtest]
texts = ["one two three", "four five"]
"""

TASK_MODULE = '''\
"""The word-count task: tokenize, let the ONNX model count the tokens, scale."""

from dataclasses import dataclass

from serving.frontends.base import BatchTokenizer, FrontModel


@dataclass(frozen=True)
class WordCountOptions:
    scale: int
    unit: str


class WordCountFront(FrontModel):
    Options = WordCountOptions

    def __init__(self, pb, args):
        super().__init__(pb, args)
        self.tokenizer = BatchTokenizer.from_file(self.asset_dir / "tokenizer.json", max_tokens=32)

    def run_group(self, texts, options):
        batch = self.encode(self.tokenizer, texts)
        feeds = {"input_ids": batch.ids, "attention_mask": batch.mask}
        counts = self.bls(self.models["counter"], feeds, ["count"])["count"][:, 0]
        if options.unit == "chars":
            counts = [len(text) for text in texts]
        return [(float(count) * options.scale,) for count in counts]
'''


def write_counter_model(path: Path) -> None:
    """count [B, 1] = sum of the attention mask over the sequence (input_ids is there to be fed, as in our models)."""
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    count = helper.make_tensor_value_info("count", TensorProto.FLOAT, ["batch", 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["mask_f", "axes"], ["count"], keepdims=1),
    ]
    graph = helper.make_graph(nodes, "counter", [ids, mask], [count], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what ONNX Runtime 1.19 (the NGC image) and 1.31 both load
    onnx.save(model, path)


def write_tokenizer(path: Path) -> None:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3, "one": 4, "two": 5, "three": 6}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


@pytest.fixture
def wordcount_folder(tmp_path, monkeypatch):
    """Everything a task author writes: the definition, the task module and the data, in one folder."""
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    (folder / "wordcount.toml").write_text(DEFINITION)
    (folder / "wordcount.py").write_text(TASK_MODULE)
    write_counter_model(folder / "counter.onnx")
    write_tokenizer(folder / "tokenizer.json")
    monkeypatch.setenv(PATH_VARIABLE, str(folder))
    return folder


def run(*argv: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.server
def test_a_task_of_ones_own_is_its_definition_a_module_and_data(wordcount_folder, tmp_path):
    repository = tmp_path / "repository"
    run("-m", "tasks", "generate", "--task", "wordcount", "--repository", str(repository))
    run("-m", "export.build_repository", "--task", "wordcount", "--repository", str(repository))
    assert sorted(p.name for p in repository.iterdir() if p.is_dir()) == ["wordcount", "wordcount_counter"]

    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        ServerOptions(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics)
    )
    server.start()
    try:
        for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
            with Client(url, protocol) as client:
                # the SDK method is derived from the definition, options included
                assert client.wordcount(["one two three", "two"]) == [3.0, 1.0]
                assert client.wordcount("one two", scale=3) == [6.0]
                with pytest.raises(ClientError, match=r"SCALE must be between 1 and 10, got 11"):
                    client.wordcount("one", scale=11)
                with pytest.raises(TypeError, match="does not take num_beams"):
                    client.wordcount("one", num_beams=2)
                # a string option: sent as BYTES, one of its choices, the default when left out
                assert client.wordcount(["one two", "three"], unit="chars", scale=2) == [14.0, 10.0]
                assert client.wordcount("one two", unit="words") == client.wordcount("one two") == [2.0]
                with pytest.raises(ClientError, match=r"UNIT must be one of words, chars, got 'bytes'") as refused:
                    client.wordcount("one", unit="bytes")
                assert refused.value.status == {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}[protocol]
        # the CLI command, with its option flags and help from the definition
        cli = run("-m", "clients", "wordcount", "one two", "three", "--scale", "2", "--url", server.grpc_url)
        assert cli.stdout.split() == ["4.0", "2.0"]
        cli = run("-m", "clients", "wordcount", "one two", "--unit", "chars", "--url", server.grpc_url)
        assert cli.stdout.split() == ["7.0"]
        usage = " ".join(run("-m", "clients", "wordcount", "--help").stdout.split())  # unwrapped
        assert "multiply the count, 1..10 (server default: 1)" in usage
        assert "what to count, one of words, chars (server default: words)" in usage
        # the load test sends the string option as BYTES over gRPC and HTTP JSON (INT32 would fail every request)
        loadtest = run(
            "-m", "loadtest.run", "--host", server.http_url, "--grpc-host", server.grpc_url, "--users", "2",
            "--duration", "2s", "--mix", "wordcount:1", "--unit", "chars", "--scale", "2",
            "--results-dir", str(tmp_path / "loadtest"), "--max-failure-ratio", "0",
        )  # fmt: skip
        assert "PASS" in loadtest.stdout, loadtest.stdout
    finally:
        server.stop()

    # the load test's entry: its texts and its place in the mix
    texts, sources = load_texts(None)
    assert texts["wordcount"] == ["one two three", "four five"] and sources["wordcount"] == "built-in list"
    assert parse_mix("wordcount:1")["wordcount"] == 1.0


def test_the_load_test_takes_a_string_option_by_its_choices(wordcount_folder):
    import argparse

    parser = argparse.ArgumentParser()
    add_option_flags(parser)
    args = parser.parse_args(["--unit", "chars"])
    assert (args.unit, args.scale, parser.parse_args([]).unit) == ("chars", 0, "")
    with pytest.raises(SystemExit):
        parser.parse_args(["--unit", "bytes"])
    # set options only, each with its type: a str goes as BYTES, an int as INT32
    assert inputs_for("wordcount", {"unit": "chars", "scale": 0}) == {"UNIT": "chars"}
    assert inputs_for("wordcount", {"unit": "", "scale": 3}) == {"SCALE": 3}


def test_the_task_path_must_name_folders(monkeypatch, tmp_path):
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path / "nowhere"))
    with pytest.raises(DefinitionError, match="not a folder"):
        registry()


@pytest.mark.parametrize("name", ["translate", "summarize", "sentiment"])
def test_a_tasks_contract_is_what_clients_read_of_it_and_nothing_of_the_server(tmp_path, name):
    """The SDK's wheel carries each task's contract (tasks/contract_file.py, written by clients/hatch_build.py)."""
    from tasks import contract_file

    whole = load(ROOT / "tasks" / f"{name}.toml")
    contract_file.write(whole.source, tmp_path / f"{name}.toml")
    text = (tmp_path / f"{name}.toml").read_text(encoding="utf-8")
    for server_side in ("instances", "queue", "front", "[engine]", "[loadtest]", "checkpoint", "models"):
        assert server_side not in text, server_side
    contract = load(tmp_path / f"{name}.toml")
    assert (contract.name, contract.summary, contract.example, contract.result) == (
        whole.name, whole.summary, whole.example, whole.result,
    )  # fmt: skip
    assert contract.options == whole.options
    for mine, theirs in zip(contract.endpoints(), whole.endpoints(), strict=True):
        assert (mine.name, mine.outputs, mine.decoupled, mine.about) == (
            theirs.name, theirs.outputs, theirs.decoupled, theirs.about,
        )  # fmt: skip
