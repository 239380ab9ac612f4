"""The gate sub-room of export: the parity gate and its texts, the verify targets, where the gate runs
and the certificates its passes become, verify, and the backend comparison (docs/architecture.md).
Imports the export leaves and graph/ (its ExportError)."""
