"""Triton python-backend model files, copied into generated repositories as ``model.py``.

They import ``triton_python_backend_utils``, which exists only inside Triton's python backend
stub: never import them elsewhere. Their logic lives in importable modules
(:mod:`kvembed.triton.rows`, the runtime) that the repository carries beside them.
"""
