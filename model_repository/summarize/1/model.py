"""Triton front model `summarize`; the logic lives in serving.frontends.generation."""

import triton_python_backend_utils as pb_utils

from serving.frontends.generation import GenerationFront


class TritonPythonModel:
    def initialize(self, args):
        self.front = GenerationFront(pb_utils, args)

    def execute(self, requests):
        return self.front.execute(requests)

    def finalize(self):
        self.front = None
