"""The dry run: a design timed on a rehearsal of its units (``rehearsal``, ``timings``) and its cost
estimated from those timings (``cost``); nothing of the real study is stored."""
