"""Load tests for the three endpoints: locust users over gRPC and HTTP, a headless runner and its report.

``make loadtest`` (or ``python -m loadtest.run``) drives a running server with the users in
:mod:`loadtest.locustfile`, then :mod:`loadtest.report` turns locust's CSV files into a summary table, a
plot and a pass/fail verdict against the failure-ratio and p99 limits. Nothing here imports torch or the
rest of the project, so the same files run in the compose ``locust`` service.
"""
