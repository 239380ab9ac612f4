"""Custom ops and TensorRT plugins: none, by decision (issue 14).

Every kvembed graph is standard ONNX. Attention, the one place a custom op could pay, is the
standard ``Attention`` operator (opset 23) in the default fused export, and TensorRT's ONNX parser
maps it to its fused IAttention layer from 10.14 on. For older TensorRT (and onnxruntime older
than 1.23.1), ``kvembed-export --attention decomposed`` writes MatMul -> Add(mask) -> Softmax ->
MatMul, which every TensorRT since 8.5 parses (NVIDIA documents that its builder fuses this
multi-head-attention pattern itself; not verified here); a plugin for TensorRT < 10.14 would duplicate that and would never run here (no GPU,
no TensorRT on this project's machines), so none is written.

Numbers (``python benchmarks/attention_forms.py``: onnxruntime 1.32 CPU, attention alone at the
Qwen3-0.6B head shape: Hq=16, Hkv=8, head_dim 128, 16 x 512 queries, 513 keys/values, additive
float mask, 2 threads, median of 3 interleaved fresh-process runs on a shared 2-core VM at load
average 4-7): fused ``Attention`` 1.16-1.29 s vs decomposed 2.69-2.83 s (0.41-0.48x), process peak
RSS 0.55 GB vs 1.55 GB (the decomposed form materialises the 16 x 16 x 512 x 513 fp32 score
tensor, 268 MB, several times), outputs equal to 4e-7 (benchmarks/RESULTS.md). On the
stories260k kv-embedding artifact the two forms agree to cosine >= 0.99999 and max abs <= 1e-4
(tests/test_attention.py). onnxruntime's own ``com.microsoft`` MultiHeadAttention, the contrib kernel a
load-time rewrite could use, was measured on the same inputs (K/V heads expanded: it has no
grouped-query mode; quiet machine, 2 rounds): 16 x 512 0.33 s and 0.93 GB vs the standard op's 0.25 s
and 0.57 GB, so no rewrite is done. ``GroupQueryAttention``'s CPU kernel derives its causal mask
from sequence lengths and has no input for kv-embedding's extra prefix column and its bias.
"""
