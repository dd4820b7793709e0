"""What a call runs on and how it is measured, shared by every part of the package (indexing, retrieval, the
server, benchmarks) without belonging to any: ``tracing.py`` (stage timers, StageTimings, OpCounter) and
``threads.py`` (torch's thread count, ``$LINEARRAG_THREADS``) and ``words.py`` (counts in English).
"""
