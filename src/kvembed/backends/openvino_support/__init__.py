"""The OpenVINO backend's helpers, one job a module, so that :mod:`kvembed.backends.openvino` holds
the backend itself (the options, the probe, the session) and stays short: the compiled-model
cache (:mod:`.compiled_cache`), reading and paging a compiled blob (:mod:`.blob`) and the rewrites
of a graph before OpenVINO compiles it (:mod:`.rewrites`). None of them imports the backend
module; it imports them and re-exports their public names."""
