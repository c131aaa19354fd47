"""The host side of the server: what starts, guards, watches and stops ``tritonserver``.

:class:`serving.launcher.embedded.EmbeddedTriton` is the one way to start it. Beside it: :mod:`.wheel` (the Triton
files inside the ``nvidia-pytriton`` wheel), :mod:`.backend_dir` (the ``--backend-directory`` layout),
:mod:`.repository` (pre-start checks), :mod:`.http_guard` (the public HTTP port), :mod:`.watchdog` (dead stubs),
:mod:`.drain` (stop without dropping requests), :mod:`.reaper` (cleanup when the launcher itself dies),
:mod:`.secret_args` (the control key off the command line), :mod:`.control` and :mod:`.probe` (Triton's HTTP API).
Nothing here runs inside a stub.
"""
