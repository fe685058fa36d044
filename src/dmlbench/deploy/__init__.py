"""Using a trained model after a benchmark: embed a collection, export the model, index and query.

A run directory's best (validation-selected) checkpoint is the model; its evaluation transform turns
images into inputs; embeddings are stored as ``.npy`` beside their paths and labels; a faiss index
over them answers queries with the evaluation engine's exact ordering.
"""
