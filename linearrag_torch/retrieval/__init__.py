"""The query path: the torch engine (engine, activation, pagerank, chain, pairs over sparse), the
question pipeline (pipeline), memory budgets (memory) and the scipy backend (scipy_backend, the oracle)."""
