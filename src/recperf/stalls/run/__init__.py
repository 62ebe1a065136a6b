"""Running a profiled job: the workloads, one run's spec and rank processes (``spec``, ``rank``,
``runner``), emulated machines (``netem``), the rank hook that times data waits and all-reduces
(``hook``), the differential runs of ``profile`` and their decomposition (``differential``), and
``launch`` for a user's own training command."""
