"""Building an index: entity counts (counting, lexicon), the graph's matrices (build) and the Ray build (ray_build).
The models it runs (spaCy's sentences and entities, the encoder) and their loaders are in models/."""
