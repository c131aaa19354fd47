"""Triton front model `sentiment`; the logic lives in serving.frontends.sentiment."""

import triton_python_backend_utils as pb_utils

from serving.frontends.sentiment import SentimentFront


class TritonPythonModel:
    def initialize(self, args):
        self.front = SentimentFront(pb_utils, args)

    def execute(self, requests):
        return self.front.execute(requests)

    def finalize(self):
        self.front = None
