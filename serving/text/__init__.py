"""Text as the models see it, shared by the server and the exporter: the tokenizer's ids and rules, and the
candidate spans of extractive summaries. The exporter imports these; nothing here imports the exporter."""
