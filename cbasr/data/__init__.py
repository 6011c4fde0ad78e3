"""Data layer: manifests, features, vocabularies, datasets and batching."""
