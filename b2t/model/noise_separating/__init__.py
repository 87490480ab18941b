"""The noise-separating decoder (family `noise_separating`): three GRU stacks, one module per part.

- `noise.NoiseModel`: its own day layer -> patches -> GRU -> linear back to the patch width:
  an estimate of the non-speech part of each patch;
- `clean.CleanSpeechModel`: its own day layer -> patches - noise estimate -> GRU -> phoneme
  logits (the head validation, `b2t-eval` and the CSV decode);
- `noisy.NoisySpeechModel`: noise estimate -> gradient reversal -> GRU -> phoneme logits,
  so it learns to read phonemes from the noise while the NoiseModel learns to leave none.
`decoder.NoiseSeparatingDecoder` joins them. Every part is built from `b2t.model.layers`.
"""

from b2t.model.noise_separating.decoder import NoiseSeparatingDecoder

__all__ = ["NoiseSeparatingDecoder"]
