"""b2t: brain-to-text phoneme decoders trained on XLA devices with fixed-shape batches.

Data flow: HDF5 sessions -> `preprocess` -> WebDataset shards -> `b2t.data` ->
device batch -> `b2t.model` -> compiled step (`b2t.train`) -> checkpoints and metrics.
"""
