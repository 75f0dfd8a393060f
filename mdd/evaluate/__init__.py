"""Evaluation stage: quality metrics, rule judge, FAISS index."""
