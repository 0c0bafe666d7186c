"""Ways out of netdef: a built net written in another format (``onnx``: the ONNX export)."""
