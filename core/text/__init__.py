"""Request text in and out: chat templates, the tokenizer, incremental detokenization with
stop strings."""
