"""Custom ops and TensorRT plugins (none needed yet: the exported graphs use standard ONNX ops)."""
