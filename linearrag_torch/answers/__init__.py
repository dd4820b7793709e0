"""Answers from a chat model over the retrieved passages (generation) and their EM/F1 scores (scoring)."""
