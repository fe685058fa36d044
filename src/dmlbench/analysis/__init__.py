"""The judging half: a study's verdicts, their power and planning, correlations, the class bootstrap and
transfer between studies, from scores alone; it imports nothing that runs a study (docs/architecture.md)."""
