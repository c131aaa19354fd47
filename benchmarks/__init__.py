"""Performance harness: every layer of the stack against its baseline, measured side by side (`make bench`).

One module per comparison (:mod:`.runtime`, :mod:`.generation`, :mod:`.serving`, :mod:`.ceiling`), shared
timing and statistics in :mod:`.stats`, the report in :mod:`.report` and :mod:`.plots`, the CLI in :mod:`.run`.
"""
