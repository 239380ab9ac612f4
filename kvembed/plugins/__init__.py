"""Custom ops and TensorRT plugins: none, by decision (issue 14).

Every kvembed graph is standard ONNX. Attention, the one place a custom op could pay, is the
standard ``Attention`` operator (opset 23) in the default fused export, and TensorRT's ONNX parser
maps it to its fused IAttention layer from 10.14 on. For older TensorRT (and onnxruntime older
than 1.23.1), ``kvembed-export --attention decomposed`` writes MatMul -> Add(mask) -> Softmax ->
MatMul, which every TensorRT since 8.5 parses (NVIDIA documents that its builder fuses this
multi-head-attention pattern itself; not verified here); a plugin for TensorRT < 10.14 would duplicate that and would never run here (no GPU,
no TensorRT on this project's machines), so none is written.

Numbers (onnxruntime 1.32 CPU, attention alone at the 8-layer Qwen3-0.6B shape: Hq=16, Hkv=8,
head_dim 128, 16 x 512 queries, 513 keys/values, additive float mask, 2 threads, median of 3
interleaved runs on a shared 2-core VM at load average ~12): fused ``Attention`` 1.61 s vs
decomposed 1.81 s (0.89x), process peak RSS 0.86 GB vs 1.75 GB (the decomposed form materialises
the 16 x 16 x 512 x 513 fp32 score tensor, 268 MB, several times), outputs equal to 3e-7. On the
stories260k kv-embedding artifact the two forms agree to cosine >= 0.99999 and max abs <= 1e-4
(tests/test_attention.py). onnxruntime's ``com.microsoft`` MultiHeadAttention / GroupQueryAttention
were not measured (time ran out); they would be applied in memory at load, never written to the file.
"""
