"""The ``model.py`` of every front model: `export.build_repository` copies this file into each version folder.

Triton's Python backend loads it; :func:`serving.frontends.loader.load_front` creates the front model class that
the task definition beside it names.
"""

import triton_python_backend_utils as pb_utils

from serving.frontends.loader import load_front


class TritonPythonModel:
    def initialize(self, args):
        self.front = load_front(pb_utils, args)

    def execute(self, requests):
        return self.front.execute(requests)

    def finalize(self):
        self.front.finalize()
        self.front = None
