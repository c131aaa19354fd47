"""Create the front model a task definition names, inside a Python backend stub.

Every front model's ``model.py`` is the same few lines (serving/frontends/triton_model.py, copied by
export.build_repository): they call :func:`load_front`, which reads the task definition (``<task>.toml``) beside
them and instantiates the class its ``front`` names. A task module shipped beside the definition (a task of your
own, outside this package) is imported from that folder.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from serving.frontends.base import FrontModel, read_endpoint, version_folder


def load_front(pb: Any, args: dict) -> FrontModel:
    folder = version_folder(args)
    name = json.loads(args["model_config"]).get("name", args.get("model_name"))
    _, endpoint = read_endpoint(folder, name)
    module_name, _, class_name = endpoint.front.partition(":")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    front_class = getattr(importlib.import_module(module_name), class_name)
    return front_class(pb, args)
