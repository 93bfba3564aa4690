"""Small leaf helpers: YAML with line numbers, sd_notify, memory trim, CPU flags, state files. The bottom
layer, with abi/: it imports nothing else of edgeinfer."""
