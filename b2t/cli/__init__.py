"""The command lines, one module each: `train` (b2t-train), `eval` (b2t-eval), `import_baseline`
(b2t-import-baseline), `report` (b2t-report), `lm` (b2t-lm); b2t-synth and b2t-preprocess live
in `preprocess`. Every command runs under one rule (`rule`: b2t's own errors are one line,
anything else is a bug and says so) and shares `options`.
"""
