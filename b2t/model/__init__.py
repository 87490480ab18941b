"""The decoder network (`decoder`, with its GRU backends in `recurrence`) and its CTC loss (`ctc`)."""
