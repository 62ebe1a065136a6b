"""The live pipeline: worker processes running segments of the stage chain (``executor``,
``workers``), the shared-memory hand-off (``items``, ``ring``) and the live tuning target."""
