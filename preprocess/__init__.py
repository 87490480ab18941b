"""Offline preparation: Brain-to-Text HDF5 sessions -> WebDataset shards of whole batches."""
