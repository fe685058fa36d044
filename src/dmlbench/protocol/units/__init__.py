"""The kinds of work a study is made of: a unit (``unit``), search trials and their fold runs
(``search``, ``fold_units``, ``feature_cache``), reproductions, the baseline, and what scoring the test
split (``scoring``) and reading the scored runs back (``results``) share."""
