"""The launcher's way of keeping the model-repository key off tritonserver's command line
(serving/launcher/secret_args.py), tried on a plain process: what the process gets as its arguments, and what other
users can read in /proc."""

from __future__ import annotations

import subprocess
import sys

from serving.launcher import secret_args

PROBE = """
import os, sys
print(sys.argv[1])
print(open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").split(b"\\0")[-1].decode())
print(b"hunter" + b"2" in open("/proc/self/environ", "rb").read())
print(any(name.startswith("ROPESERVE_SECRET_ARGUMENT_") for name in os.environ))
"""


def test_hide_moves_only_the_secret_arguments_into_the_environment():
    command = ["tritonserver", "--port=1", "--api=key:hunter2", "--other=hunter2x"]
    shown, environment = secret_args.hide(command, "hunter2", {"LD_PRELOAD": "/opt/tcmalloc.so", "HOME": "/h"})
    assert shown == ["tritonserver", "--port=1", "--ropeserve-secret-argument=0", "--ropeserve-secret-argument=1"]
    assert environment["ROPESERVE_SECRET_ARGUMENT_0"] == "--api=key:hunter2"
    assert environment["ROPESERVE_SECRET_ARGUMENT_1"] == "--other=hunter2x"
    assert environment["LD_PRELOAD"] == f"{secret_args.library()}:/opt/tcmalloc.so"  # an allocator preload stays
    assert environment["HOME"] == "/h"
    assert secret_args.hide(["a", "b"], "hunter2", {}) == (["a", "b"], {})  # nothing to hide: nothing preloaded


def test_the_process_gets_the_secret_but_its_command_line_and_environment_do_not_show_it():
    shown, environment = secret_args.hide([sys.executable, "-c", PROBE, "--key=hunter2"], "hunter2", {})
    shown.insert(3, shown.pop())  # the secret argument after the script, as sys.argv[1]
    result = subprocess.run(shown, env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    argv, cmdline, in_environ, variable_left = result.stdout.split()
    assert argv == "--key=hunter2"  # main() saw the real argument
    assert cmdline == "--ropeserve-secret-argument=0"  # what /proc/<pid>/cmdline shows everyone
    assert in_environ == "False" and variable_left == "False"
