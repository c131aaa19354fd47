"""Names come out right: the name probes of export/evaluation/name_probes.py through the real `translate` endpoint."""

from __future__ import annotations

from clients import Client
from export.evaluation.name_probes import NAMED, meets_goal, wrong_names


def test_names_come_out_right_with_the_endpoints_defaults(triton):
    with Client(triton.grpc_url) as client:
        outputs = client.translate([sentence for sentence, _ in NAMED])  # beam 4, the endpoint's default
    wrong = wrong_names(outputs)
    assert meets_goal(len(NAMED) - len(wrong)), "\n".join(wrong)
