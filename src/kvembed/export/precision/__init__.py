"""The precision sub-room of export: fp16 and int8 conversions of the traced fp32 graph, weight
quantisation, SmoothQuant and calibration, the int8 embedding table (docs/architecture.md). Imports
only the export leaves."""
