"""Phonemes -> words: pronunciation lexicons, n-gram LMs built as ARPA text, and the
lexicon-constrained CTC beam search (flashlight-text + KenLM) that turns one trial's
phoneme log-probabilities into a sentence, beside the no-LM greedy spelling baseline.

Modules: `lexicon` (word pronunciations, text normalisation), `ngram` (ARPA builder),
`beam` (decoder), `nbest` (its n best hypotheses and the weights that choose among them),
`rescore` (a causal LM's sentence scores, the `rescore` extra), `tune` (weights tuned on
val and their file), `cli` (`b2t-lm build`, `b2t-lm lexicon`).
"""
