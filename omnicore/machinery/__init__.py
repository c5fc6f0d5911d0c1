"""The machinery: what gets the core running on a machine, none of it part of the algorithm.

    checkpoint.py   finding a checkpoint (a folder or the hub) and reading its files safely
    torchfile.py    torch's zip format read without torch (saved voice prompts, .pt files)
    settings.py     the process's runtime settings, read once: backend, threads, CUDA graphs
    warmup.py       the first run on a machine: the kernels compiled ahead, and said so
"""
