"""Neural network modules: encoders, decoders and the models that compose them."""
