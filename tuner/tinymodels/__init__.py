"""Small local models for end-to-end runs: random weights, word-level tokenizer, no download."""
