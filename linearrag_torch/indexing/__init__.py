"""Building an index: sentence split and NER (nlp), the encoder (encoding, bert_forward, onnx_encoder),
entity counts (counting, lexicon), the graph's matrices (build) and the Ray build (ray_build)."""
