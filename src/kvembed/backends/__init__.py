"""Backends: one file per engine that runs an artifact's graph (onnxruntime, OpenVINO, TensorRT),
all behind the session protocol of :mod:`~kvembed.backends.protocol`, listed in
:mod:`~kvembed.backends.catalogue` (names, probes, options, what ``"auto"`` picks). Torch-free.
"""
