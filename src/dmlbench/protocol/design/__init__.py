"""What a study is: the benchmark file (``benchmark``), its stored record (``benchmark_file``), search
spaces, the class-disjoint folds, every method's plan and what the methods must share, and ``prepare``,
which validates all of it before anything is written."""
