"""The parts of an imported generation task's definition (tasks/<name>.toml) that every importer writes alike:
the engine's endpoint settings, the decoding options, the translation load test."""

from __future__ import annotations

from tasks import generation_contract as contract

SPLIT_SENTENCES = """
[options.split_sentences]
input = "SPLIT_SENTENCES"
default = "1"
choices = ["1", "nonewlines", "0"]
flags = ["--split-sentences"]
help = "1: split at end punctuation and line breaks; nonewlines: at end punctuation only; 0: the text is one sentence"
"""

TRANSLATION_LOADTEST = """file = "translation/tatoeba_test_zh_en.tsv"
column = 0
header = true
paragraphs = true"""


def engine_endpoint(front: str, int8: bool) -> str:
    """An [endpoint] or [stream] table's settings for a front on the engine: one engine of two ONNX Runtime
    threads (at these sizes the matrix products, not the Python loop between steps, take the time, and one engine
    batches every request together)."""
    precision = '\nprecision = "int8"' if int8 else ""
    return f"""front = "{front}"
graphs = "export.build_repository:imported_graphs"
threads = 2
max_batch_size = 64
instances = 1
queue = {{ max_size = 64, timeout_s = 5 }}{precision}"""


def generation_options(max_new_tokens: int, most_new_tokens: int, num_beams: int, split: bool, why_most: str) -> str:
    """The [options] tables of MAX_NEW_TOKENS, NUM_BEAMS and, for a translator, SPLIT_SENTENCES."""
    beams = min(num_beams, contract.MAX_BEAMS)
    return f"""
[options.max_new_tokens]
input = "MAX_NEW_TOKENS"
default = {min(max_new_tokens, most_new_tokens)}
range = [1, {most_new_tokens}]  # {why_most}
help = "cap on generated tokens"

[options.num_beams]
input = "NUM_BEAMS"
default = {beams}
range = [1, {contract.MAX_BEAMS}]
flags = ["--beams", "--num-beams"]
help = "beam width; 1 is greedy"
{SPLIT_SENTENCES if split else ""}"""
