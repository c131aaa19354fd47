"""Triton front model `translate_explain`; the logic lives in serving.frontends.explain."""

import triton_python_backend_utils as pb_utils

from serving.frontends.explain import TranslateExplainFront


class TritonPythonModel:
    def initialize(self, args):
        self.front = TranslateExplainFront(pb_utils, args)

    def execute(self, requests):
        return self.front.execute(requests)

    def finalize(self):
        self.front = None
