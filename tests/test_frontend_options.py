"""A request's options arrive as the front model's typed ``Options`` (serving/frontends/options.py), and the front
model refuses, when it loads, a definition whose options do not fit them."""

from __future__ import annotations

import importlib

import pytest

from serving.frontends.engine_front import EngineFront
from serving.frontends.options import GenerationOptions, check_options
from tasks import registry


def front_class(front: str) -> type:
    module, _, name = front.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    "endpoint", [e for task in registry().values() for e in task.endpoints()], ids=lambda e: e.name
)
def test_every_front_reads_exactly_what_its_definition_declares(endpoint):
    task = next(t for t in registry().values() if endpoint in list(t.endpoints()))
    check_options(front_class(endpoint.front).Options, [o.keyword for o in task.options], endpoint.name)


def test_a_definition_with_an_option_the_front_ignores_is_refused_by_name():
    with pytest.raises(ValueError, match=r"not read by the front model: \['temperature'\]"):
        check_options(GenerationOptions, ["max_new_tokens", "num_beams", "temperature"], "translate")


def test_a_front_reading_an_option_the_definition_lacks_is_refused_by_name():
    with pytest.raises(ValueError, match=r"read but not declared: \['num_beams'\]"):
        check_options(GenerationOptions, ["max_new_tokens"], "translate")


class NoTensors:
    """The stub's module as parse_options uses it: a request that sent no option tensors."""

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return None


def test_a_request_without_options_gets_the_definitions_defaults_as_typed_fields():
    front = EngineFront.__new__(EngineFront)  # no Triton: only what parse_options reads
    front.pb, front.task = NoTensors(), registry()["translate"]
    options = front.parse_options(request=None, rows=1)
    assert isinstance(options, GenerationOptions)
    assert {o.keyword: getattr(options, o.keyword) for o in front.task.options} == {
        o.keyword: o.default for o in front.task.options
    }
    assert hash(options) == hash(front.parse_options(request=None, rows=2))  # equal options group together
