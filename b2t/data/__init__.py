"""Shards -> device batches: the manifest, the sample codec and the WebDataset reader."""
