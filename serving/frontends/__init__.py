"""Request handling for the public front models (`sentiment`, `translate`, `summarize`).

The files under `model_repository/<task>/1/model.py` only create one of these classes and
forward `execute`; everything here is importable without a running server so tests can
call it directly.
"""
