"""Running a study: the stages in the order a worker takes their units (``stages``), the one scheduling
loop (``schedule``), local worker processes (``jobs``) and the records a study writes (``record``)."""
