"""The graph sub-room of export: the trace, operator sets, graph rewrites and checks, and the OpenVINO
graph of an int8 artifact (docs/architecture.md). Imports only the export leaves."""
