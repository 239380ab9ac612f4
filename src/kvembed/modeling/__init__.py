"""The torch wing: where a model comes from (folder, alias, GGUF, hub), loading it with
transformers, the patched forward (:mod:`kvembed.modeling.patch`), the PyTorch reference
(:mod:`kvembed.modeling.reference`) and Causal2Vec checkpoints.

Its modules import one another in one direction only (tests/test_architecture.py checks it):
``quiet`` and ``causal2vec`` first, then ``gguf``, ``sources``, ``hf_loading``, ``patch`` and
``reference`` last.
"""
